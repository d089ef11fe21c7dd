//! The fused CPU kernels against the composed forms they replace, end to end: for every
//! mixer and option, one language model's loss and the gradient of every parameter are the
//! same with the kernels on and off. (The only test of this binary: it switches the
//! process-wide `hla_model::fused::set_enabled`.)

mod common;

use burn::prelude::*;
use common::{MIXERS, Rng, devices, param_grads, rel_rms, tiny};
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

#[test]
fn fused_kernels_change_no_loss_and_no_gradient() {
    for device in devices() {
        let ad = device.clone().autodiff();
        for config in configs() {
            ad.seed(3);
            let lm = config.init(&ad);
            let mut rng = Rng::new(5);
            let mut tokens = |n: usize| -> Vec<i64> {
                (0..n)
                    .map(|_| (rng.between(0.0, 37.0) as i64).min(36))
                    .collect()
            };
            let (b, t) = (3, 21);
            let data = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [b, t]), &ad);
            let (inputs, targets) = (data(tokens(b * t)), data(tokens(b * t)));
            hla_model::fused::set_enabled(true);
            let fused = loss_and_grads(&lm, &inputs, &targets);
            hla_model::fused::set_enabled(false);
            let composed = loss_and_grads(&lm, &inputs, &targets);
            hla_model::fused::set_enabled(true);
            let case = format!("{config:?} on {device:?}");
            let loss_error = rel_rms(&fused.0, &composed.0);
            assert!(loss_error < 1e-5, "{case}: loss error {loss_error:e}");
            for (i, (f, c)) in fused.1.iter().zip(&composed.1).enumerate() {
                let error = rel_rms(f, c);
                assert!(
                    error < 1e-4,
                    "{case}: parameter {i}: gradient error {error:e}"
                );
            }
        }
    }
}
