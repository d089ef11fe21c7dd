//! The CPU kernels against the composed forms they replace, end to end: for every
//! mixer and option, one language model's loss and the gradient of every parameter, and its
//! token-by-token logits from the serial recurrence, are the same with the kernels on and
//! off. (The only tests of this binary, one after the other: they switch the process-wide
//! `hla_model::backend::set_kernels`.)

mod common;

use burn::prelude::*;
use common::{MIXERS, Rng, devices, param_grads, rel_rms, tiny};
use hla_model::backend::{Kernels, set_kernels};
use hla_model::lm::{DecayKind, FeatureMap, Lm, LmConfig, MixerKind, MlpKind, NormKind, Positions};

/// The tiny model of every case, with options changed one at a time.
fn configs() -> Vec<LmConfig> {
    let mut out = Vec::new();
    for mixer in MIXERS {
        let base = tiny(mixer);
        out.extend([
            base.clone(),
            base.clone().with_short_conv(0).with_tie_embeddings(false),
            base.clone().with_mlp(false).with_segment_size(16),
            base.clone()
                .with_positions(Positions::Learned)
                .with_norm(NormKind::Layer)
                .with_mlp_kind(MlpKind::Gelu),
        ]);
        if mixer != MixerKind::Softmax {
            out.extend([
                base.clone().with_decay(DecayKind::Gated),
                base.clone()
                    .with_decay(DecayKind::None)
                    .with_output_gate(true),
                base.clone().with_shared_keys(true),
                // The default divides by the masked denominator; with the output norm too.
                base.clone().with_output_norm(Some(true)),
            ]);
            // Without the denominator, every feature map.
            let raw = base.clone().with_normalize(Some(false));
            out.extend(
                [
                    FeatureMap::EluPlusOne,
                    FeatureMap::Scale,
                    FeatureMap::Identity,
                    FeatureMap::L2,
                ]
                .map(|map| raw.clone().with_feature_map(Some(map))),
            );
        }
    }
    out
}

/// The loss of `lm` on `inputs` and the gradient of every parameter.
fn loss_and_grads(
    lm: &Lm,
    inputs: &Tensor<2, Int>,
    targets: &Tensor<2, Int>,
) -> (Tensor<1>, Vec<Tensor<1>>) {
    let loss = lm.loss(inputs.clone(), targets.clone());
    let grads = param_grads(lm, &loss.backward());
    (loss.inner(), grads)
}

/// Data for `b` sequences of `t` tokens of the tiny models' vocabulary.
fn tokens(rng: &mut Rng, (b, t): (usize, usize), device: &Device) -> Tensor<2, Int> {
    let values: Vec<i64> = (0..b * t)
        .map(|_| (rng.between(0.0, 37.0) as i64).min(36))
        .collect();
    Tensor::from_data(TensorData::new(values, [b, t]), device)
}

#[test]
fn cpu_kernels_change_no_loss_and_no_gradient() {
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    for device in devices() {
        let ad = device.clone().autodiff();
        for config in configs() {
            ad.seed(3);
            let lm = config.init(&ad);
            let mut rng = Rng::new(5);
            let (inputs, targets) = (
                tokens(&mut rng, (3, 21), &ad),
                tokens(&mut rng, (3, 21), &ad),
            );
            set_kernels(Kernels::Auto);
            let kernel = loss_and_grads(&lm, &inputs, &targets);
            set_kernels(Kernels::None);
            let composed = loss_and_grads(&lm, &inputs, &targets);
            set_kernels(Kernels::Auto);
            let case = format!("{config:?} on {device:?}");
            let loss_error = rel_rms(&kernel.0, &composed.0);
            assert!(loss_error < 1e-5, "{case}: loss error {loss_error:e}");
            for (i, (f, c)) in kernel.1.iter().zip(&composed.1).enumerate() {
                let error = rel_rms(f, c);
                assert!(
                    error < 1e-4,
                    "{case}: parameter {i}: gradient error {error:e}"
                );
            }
        }
    }
}

/// Generation and evaluation without gradients run the serial recurrence's CPU kernel: after a
/// prompt, each step's logits and the state equal the composed recurrence's.
#[test]
fn cpu_serial_steps_equal_the_composed_recurrence() {
    let _one_at_a_time = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    for device in devices() {
        for config in configs() {
            device.seed(3);
            let lm = config.init(&device);
            let ids = tokens(&mut Rng::new(7), (2, 13), &device);
            let mut runs = Vec::new();
            for kernels in [Kernels::Auto, Kernels::None] {
                set_kernels(kernels);
                let mut state = lm.init_state(2);
                let mut steps = vec![lm.prefill(ids.clone().slice(s![.., 0..5]), &mut state)];
                for t in 5..13 {
                    let token = ids.clone().slice(s![.., t..=t]).squeeze_dim(1);
                    steps.push(lm.step(token, &mut state).unsqueeze_dim(1));
                }
                runs.push(Tensor::cat(steps, 1));
            }
            set_kernels(Kernels::Auto);
            let error = rel_rms(&runs[0], &runs[1]);
            assert!(
                error < 1e-5,
                "{config:?} on {device:?}: logits error {error:e}"
            );
        }
    }
}

/// The tests switch the process-wide kernels; they take turns.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
