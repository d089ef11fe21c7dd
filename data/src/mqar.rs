//! Multi-query associative recall (MQAR), exactly the Zoology generator's rules
//! (`zoology/data/multiquery_ar.py`): N key–value pairs, then every key queried once after a
//! power-law gap; the model must output the value at the position of the query key.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::windows::LmItem;

/// One (T, N) setting with its number of examples.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqarSetting {
    /// Input length T.
    pub seq_len: usize,
    /// Key–value pairs N.
    pub num_kv_pairs: usize,
    pub train_examples: usize,
    pub test_examples: usize,
}

/// The task: a vocabulary and one or more settings (Zoology's "original" mix has several).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqarConfig {
    pub vocab_size: usize,
    pub settings: Vec<MqarSetting>,
    /// Exponent a of the gap distribution p(i) ∝ a·i^(a−1).
    #[serde(default = "default_power_a")]
    pub power_a: f64,
    /// Replace the filler token 0 by uniform random tokens.
    #[serde(default = "default_true")]
    pub random_non_queries: bool,
    #[serde(default)]
    pub seed: u64,
}

fn default_power_a() -> f64 {
    0.01
}

fn default_true() -> bool {
    true
}

impl MqarConfig {
    /// Zoology's constraints: 4N ≤ T, T even, V > T.
    pub fn validate(&self) -> Result<(), DataError> {
        let invalid = |key, requirement: String, value: String| {
            Err(DataError::Invalid {
                key,
                requirement,
                value,
            })
        };
        if self.settings.is_empty() {
            return invalid(
                "mqar.settings",
                "at least one (seq_len, num_kv_pairs) setting".into(),
                "[]".into(),
            );
        }
        if !(self.power_a > 0.0 && self.power_a.is_finite()) {
            return invalid("mqar.power_a", "positive".into(), self.power_a.to_string());
        }
        for s in &self.settings {
            if s.num_kv_pairs == 0 || 4 * s.num_kv_pairs > s.seq_len {
                let requirement = format!("between 1 and seq_len / 4 = {}", s.seq_len / 4);
                return invalid("mqar.num_kv_pairs", requirement, s.num_kv_pairs.to_string());
            }
            if s.seq_len % 2 != 0 {
                return invalid("mqar.seq_len", "even".into(), s.seq_len.to_string());
            }
            if self.vocab_size <= s.seq_len {
                let requirement = format!("larger than seq_len ({})", s.seq_len);
                return invalid("mqar.vocab_size", requirement, self.vocab_size.to_string());
            }
        }
        Ok(())
    }

    /// Checks that each split has examples, as a run needs; a setting may serve one split
    /// only (Zoology tests on lengths it does not train on).
    pub fn validate_splits(&self) -> Result<(), DataError> {
        let total = |count: fn(&MqarSetting) -> usize| {
            self.settings
                .iter()
                .map(count)
                .fold(0, usize::saturating_add)
        };
        for (key, total) in [
            ("mqar.train_examples", total(|s| s.train_examples)),
            ("mqar.test_examples", total(|s| s.test_examples)),
        ] {
            if total == 0 {
                return Err(DataError::Invalid {
                    key,
                    requirement: "at least 1 in some setting".into(),
                    value: "0 in every one".into(),
                });
            }
        }
        Ok(())
    }

    /// The training set (all settings, in order).
    pub fn train(&self) -> Result<Vec<LmItem>, DataError> {
        self.generate(|s| s.train_examples, self.seed)
    }

    /// The test set, drawn with another seed.
    pub fn test(&self) -> Result<Vec<LmItem>, DataError> {
        self.generate(|s| s.test_examples, self.seed.wrapping_add(1))
    }

    fn generate(
        &self,
        count: impl Fn(&MqarSetting) -> usize,
        seed: u64,
    ) -> Result<Vec<LmItem>, DataError> {
        self.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut items = Vec::new();
        for setting in &self.settings {
            for _ in 0..count(setting) {
                items.push(self.sample(setting, &mut rng));
            }
        }
        Ok(items)
    }

    fn sample(&self, s: &MqarSetting, rng: &mut ChaCha8Rng) -> LmItem {
        let (v, n) = (self.vocab_size as u32, s.num_kv_pairs);
        let keys = distinct(rng, 1..v / 2, n);
        let values = distinct(rng, v / 2..v, n);
        let space = (s.seq_len - 2 * n) / 2;
        let gaps = power_law_gaps(rng, space, n, self.power_a);
        let mut item = layout(&keys, &values, &gaps, s.seq_len);
        if self.random_non_queries {
            for x in item.inputs.iter_mut().filter(|x| **x == 0) {
                *x = rng.random_range(0..v);
            }
        }
        item
    }
}

/// The example for given keys, values and gaps (Zoology's layout): the context
/// `k1 v1 … kN vN`, then key j at offset `2·gap_j` of the query region; the target `v_j`
/// is scored at the position of its query key. Filler is token 0.
pub fn layout(keys: &[u32], values: &[u32], gaps: &[usize], seq_len: usize) -> LmItem {
    let context = 2 * keys.len();
    let mut seq = vec![0u32; seq_len + 1];
    let mut labels: Vec<Option<u32>> = vec![None; seq_len + 1];
    for (j, (&k, &v)) in keys.iter().zip(values).enumerate() {
        (seq[2 * j], seq[2 * j + 1]) = (k, v);
        let at = context + 2 * gaps[j];
        seq[at] = k;
        labels[at + 1] = Some(v);
    }
    let targets: Vec<Option<u32>> = labels[1..].to_vec();
    LmItem {
        inputs: seq[..seq_len].to_vec(),
        mask: targets.iter().map(Option::is_some).collect(),
        targets: targets.into_iter().map(|t| t.unwrap_or(0)).collect(),
    }
}

/// `n` distinct tokens from `range`.
fn distinct(rng: &mut ChaCha8Rng, range: std::ops::Range<u32>, n: usize) -> Vec<u32> {
    let mut pool: Vec<u32> = range.collect();
    pool.shuffle(rng);
    pool.truncate(n);
    pool
}

/// `n` distinct gaps from `0..space`, gap `i − 1` drawn with weight `a·i^(a−1)`, without
/// replacement (numpy's `choice(space, n, replace=False, p)`).
fn power_law_gaps(rng: &mut ChaCha8Rng, space: usize, n: usize, a: f64) -> Vec<usize> {
    let mut weights: Vec<f64> = (1..=space).map(|i| a * (i as f64).powf(a - 1.0)).collect();
    let mut gaps = Vec::with_capacity(n);
    for _ in 0..n {
        let total: f64 = weights.iter().sum();
        let mut u = rng.random_range(0.0..total);
        let pick = weights
            .iter()
            .position(|&w| {
                u -= w;
                u < 0.0 && w > 0.0
            })
            .unwrap_or_else(|| weights.iter().rposition(|&w| w > 0.0).expect("n ≤ space"));
        weights[pick] = 0.0;
        gaps.push(pick);
    }
    gaps
}

/// Exact-match accuracy per example over its scored positions, averaged over examples
/// (Zoology's `compute_metrics`). `correct[i]` and `mask[i]` are per position, row-major
/// `[examples, time]`.
pub fn accuracy(correct: &[bool], mask: &[bool], time: usize) -> f64 {
    let per_example: Vec<f64> = correct
        .chunks(time)
        .zip(mask.chunks(time))
        .filter(|(_, m)| m.iter().any(|&x| x))
        .map(|(c, m)| {
            let scored = m.iter().filter(|&&x| x).count();
            let hits = c.iter().zip(m).filter(|&(&c, &m)| c && m).count();
            hits as f64 / scored as f64
        })
        .collect();
    per_example.iter().sum::<f64>() / per_example.len().max(1) as f64
}
