//! MQAR follows Zoology's rules.

use burn::data::dataloader::batcher::Batcher;
use burn::prelude::*;
use hla_data::batch::{LmBatch, LmBatcher};
use hla_data::mqar::{self, MqarConfig, MqarSetting};

fn config(seq_len: usize, num_kv_pairs: usize, examples: usize, random: bool) -> MqarConfig {
    MqarConfig {
        vocab_size: 128,
        settings: vec![MqarSetting {
            seq_len,
            num_kv_pairs,
            train_examples: examples,
            test_examples: examples / 2,
        }],
        power_a: 0.01,
        random_non_queries: random,
        seed: 1,
    }
}

/// The docstring example of `zoology/data/multiquery_ar.py` (V = 12, N = 2, T = 16).
#[test]
fn zoology_documented_example() {
    let item = mqar::layout(&[2, 4], &[8, 7], &[4, 1], 16);
    assert_eq!(
        item.inputs,
        vec![2, 8, 4, 7, 0, 0, 4, 0, 0, 0, 0, 0, 2, 0, 0, 0]
    );
    let scored: Vec<(usize, u32)> = (0..16)
        .filter(|&i| item.mask[i])
        .map(|i| (i, item.targets[i]))
        .collect();
    assert_eq!(scored, vec![(6, 7), (12, 8)], "7 then 8, at the query keys");
}

#[test]
fn every_key_is_queried_once_with_its_value() {
    for random in [false, true] {
        let items = config(64, 8, 200, random).train().unwrap();
        assert_eq!(items.len(), 200);
        for item in &items {
            assert_eq!(item.inputs.len(), 64);
            let pairs: Vec<(u32, u32)> =
                item.inputs[..16].chunks(2).map(|p| (p[0], p[1])).collect();
            assert!(
                pairs
                    .iter()
                    .all(|&(k, v)| (1..64).contains(&k) && (64..128).contains(&v))
            );
            let mut keys: Vec<u32> = pairs.iter().map(|p| p.0).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), 8, "distinct keys");
            let queries: Vec<(u32, u32)> = (0..64)
                .filter(|&i| item.mask[i])
                .map(|i| (item.inputs[i], item.targets[i]))
                .collect();
            assert_eq!(queries.len(), 8, "one query per key");
            let mut queried: Vec<(u32, u32)> = queries.clone();
            queried.sort();
            let mut expected = pairs.clone();
            expected.sort();
            assert_eq!(queried, expected, "each query key is answered by its value");
            assert!(
                (0..16).all(|i| !item.mask[i]),
                "nothing scored in the context"
            );
            if !random {
                let fill = item.inputs[16..].iter().filter(|&&x| x == 0).count();
                assert_eq!(fill, 48 - 8, "filler is 0 without random fill");
            }
        }
    }
}

/// With one pair the gap is a single draw from p(i) ∝ a·i^(a−1), i = 1..space.
#[test]
fn gaps_follow_the_power_law() {
    let (seq_len, draws) = (32, 20_000);
    let items = config(seq_len, 1, draws, false).train().unwrap();
    let space = (seq_len - 2) / 2;
    let mut counts = vec![0usize; space];
    for item in &items {
        let at = (0..seq_len).find(|&i| item.mask[i]).unwrap();
        counts[(at - 2) / 2] += 1;
    }
    let weights: Vec<f64> = (1..=space).map(|i| 0.01 * (i as f64).powf(-0.99)).collect();
    let total: f64 = weights.iter().sum();
    for (gap, (&count, w)) in counts.iter().zip(&weights).enumerate() {
        let p = w / total;
        let sigma = (draws as f64 * p * (1.0 - p)).sqrt();
        let diff = (count as f64 - draws as f64 * p).abs();
        assert!(
            diff < 5.0 * sigma + 1.0,
            "gap {gap}: {count} draws, expected {:.0} ± {sigma:.0}",
            draws as f64 * p
        );
    }
}

#[test]
fn seeds_make_data_reproducible() {
    let a = config(64, 4, 20, true);
    assert_eq!(a.train().unwrap(), a.train().unwrap());
    assert_ne!(
        a.train().unwrap()[..10],
        a.test().unwrap()[..],
        "train and test differ"
    );
    let b = MqarConfig {
        seed: 2,
        ..a.clone()
    };
    assert_ne!(a.train().unwrap(), b.train().unwrap());
}

#[test]
fn impossible_settings_are_errors() {
    let too_many = config(64, 17, 1, false).train().unwrap_err().to_string();
    assert_eq!(
        too_many,
        "mqar.num_kv_pairs must be between 1 and seq_len / 4 = 16, got 17"
    );
    let small_vocab = MqarConfig {
        vocab_size: 64,
        ..config(64, 4, 1, false)
    }
    .train()
    .unwrap_err()
    .to_string();
    assert_eq!(
        small_vocab,
        "mqar.vocab_size must be larger than seq_len (64), got 64"
    );
}

#[test]
fn mixed_settings_batch_with_padding() {
    let mut mix = config(16, 2, 2, true);
    mix.settings.push(MqarSetting {
        seq_len: 32,
        num_kv_pairs: 4,
        train_examples: 1,
        test_examples: 0,
    });
    let items = mix.train().unwrap();
    let lengths: Vec<usize> = items.iter().map(|i| i.inputs.len()).collect();
    assert_eq!(lengths, vec![16, 16, 32]);
    let device = Device::default();
    let batch: LmBatch = LmBatcher.batch(items.clone(), &device);
    assert_eq!(batch.inputs.dims(), [3, 32]);
    let mask: Vec<bool> = batch.target_mask.into_data().try_to_vec().unwrap();
    let scored: usize = items
        .iter()
        .map(|i| i.mask.iter().filter(|&&m| m).count())
        .sum();
    assert_eq!(
        mask.iter().filter(|&&m| m).count(),
        scored,
        "padding is never scored"
    );
    let inputs: Vec<i64> = batch
        .inputs
        .into_data()
        .convert::<i64>()
        .try_to_vec()
        .unwrap();
    assert_eq!(
        inputs[..16].iter().map(|&x| x as u32).collect::<Vec<_>>(),
        items[0].inputs
    );
}

#[test]
fn accuracy_is_per_example_then_averaged() {
    // Example 1: 1 of 2 scored positions right; example 2: 1 of 1.
    let correct = [true, false, false, false, true, false];
    let mask = [true, true, false, false, true, false];
    assert!((mqar::accuracy(&correct, &mask, 3) - 0.75).abs() < 1e-12);
}
