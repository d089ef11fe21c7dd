//! The language model: the three ways to run agree, gradients reach every parameter,
//! AdamW learns, and long sequences stay finite; what a configuration builds in
//! [`config`].

#[path = "../common/mod.rs"]
mod common;
mod config;

use burn::module::{ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use common::{MIXERS, Rng, TOL, devices, param_grads, rel_rms, tiny};
use hla_model::lm::{
    DecayKind, FeatureMap, Lm, LmConfig, LmState, MixerKind, MlpKind, NormKind, Positions,
};

/// The options a mixer can take, each changed from the defaults on its own.
fn variants(mixer: MixerKind) -> Vec<LmConfig> {
    let base = tiny(mixer);
    let mut out = vec![
        base.clone(),
        base.clone().with_short_conv(0),
        // GPT-2's recipe: learned positions, LayerNorm, GELU MLP.
        base.clone()
            .with_positions(Positions::Learned)
            .with_norm(NormKind::Layer)
            .with_mlp_kind(MlpKind::Gelu),
        // Mixers only; passes of 8 tokens (two chunks of 4) carrying the state.
        base.clone()
            .with_mlp(false)
            .with_chunk_size(4)
            .with_segment_size(8),
    ];
    if mixer != MixerKind::Softmax {
        out.extend([
            base.clone().with_decay(DecayKind::Gated),
            base.clone().with_decay(DecayKind::None),
            // RetNet's base, which the MQAR configs keep (the default is 0.5).
            base.clone().with_decay_base(5.0),
            base.clone().with_shared_keys(true).with_output_gate(true),
            // Both output recipes, whichever is the mixer's default: the ratio
            // normalisation, and L2 features with the output norm.
            base.clone()
                .with_normalize(Some(true))
                .with_output_norm(Some(false))
                .with_feature_map(Some(FeatureMap::EluPlusOne)),
            base.clone()
                .with_normalize(Some(false))
                .with_output_norm(Some(true))
                .with_feature_map(Some(FeatureMap::L2)),
        ]);
    }
    out
}

fn tokens(
    rng: &mut Rng,
    batch: usize,
    time: usize,
    vocab: usize,
    device: &Device,
) -> Tensor<2, Int> {
    let values: Vec<i64> = (0..batch * time)
        .map(|_| rng.between(0.0, vocab as f64) as i64)
        .collect();
    Tensor::from_data(TensorData::new(values, [batch, time]), device)
}

/// The logits `[batch, time, vocab]` of `ids` served as generation does: a prefill of the
/// first `prompt` tokens, then a step per token from the state; with the final state.
fn prefill_then_step(model: &Lm, ids: &Tensor<2, Int>, prompt: usize) -> (Tensor<3>, LmState) {
    let time = ids.dims()[1];
    let mut state = model.init_state(ids.dims()[0]);
    let mut parts = vec![model.prefill(ids.clone().slice(s![.., 0..prompt]), &mut state)];
    for t in prompt..time {
        let token = ids.clone().slice(s![.., t..=t]).squeeze_dim(1);
        parts.push(model.step(token, &mut state).unsqueeze_dim(1));
    }
    (Tensor::cat(parts, 1), state)
}

/// flash-linear-attention's generation test: a full forward equals prefill of a prompt
/// followed by token-by-token steps from its state (and `prefill_last` the prompt's last
/// row of it).
#[test]
fn prefill_then_step_equals_full_forward() {
    for device in devices() {
        let mut worst: f64 = 0.0;
        for mixer in MIXERS {
            for config in variants(mixer) {
                let model = config.init(&device);
                let ids = tokens(&mut Rng::new(3), 2, 21, config.vocab_size, &device);
                let full = model.forward(ids.clone());
                let (served, state) = prefill_then_step(&model, &ids, 9);
                assert_eq!(state.position(), 21);
                let err = rel_rms(&served, &full);
                assert!(
                    err <= TOL,
                    "{mixer:?}: prefill + step vs forward {err:.3e} for {config:?}"
                );
                let last =
                    model.prefill_last(ids.clone().slice(s![.., 0..9]), &mut model.init_state(2));
                let want = full.clone().slice(s![.., 8..9, ..]).squeeze_dim::<2>(1);
                let err = rel_rms(&last, &want);
                assert!(
                    err <= TOL,
                    "{mixer:?}: prefill_last {err:.3e} for {config:?}"
                );
                worst = worst.max(err);
            }
        }
        eprintln!("generation parity on {device:?}: largest relative RMS error {worst:.2e}");
    }
}

/// Hybrid stacks, a mixer per layer: every mixer in one stack, with the ratio
/// normalisation and without (then linear attention's features differ from HLA's), gated,
/// and softmax first: prefill then serial steps equal the chunked forward, and each
/// layer's state is its own (the KV cache grows, the others do not).
#[test]
fn hybrid_stacks_step_as_they_run_chunked() {
    use MixerKind::{Ahla, Hla2, Hla3, Linear, Softmax};
    let every = vec![Hla2, Hla3, Ahla, Linear, Softmax];
    let hybrid = |layers: Vec<MixerKind>| {
        tiny(Hla2)
            .with_n_layers(layers.len())
            .with_layers(Some(layers))
    };
    let configs = [
        hybrid(every.clone()),
        hybrid(every.clone()).with_normalize(Some(false)),
        hybrid(vec![Softmax, Hla2, Hla2]).with_decay(DecayKind::Gated),
    ];
    for device in devices() {
        for config in &configs {
            config.validate().unwrap();
            let model = config.init(&device);
            let ids = tokens(&mut Rng::new(4), 2, 21, config.vocab_size, &device);
            let full = model.forward(ids.clone());
            let (served, _) = prefill_then_step(&model, &ids, 9);
            let err = rel_rms(&served, &full);
            assert!(
                err <= TOL,
                "{}: serial vs chunked {err:.3e}",
                config.mixer_label()
            );
        }
        let model = configs[0].init(&device);
        let (short, long) = (model.state_sizes(10), model.state_sizes(20));
        for (i, kind) in every.iter().enumerate() {
            let one = tiny(*kind).init(&device).state_sizes(10)[0];
            assert_eq!(short[i], one, "layer {i}: {kind:?}'s state");
            assert_eq!(long[i] > short[i], *kind == Softmax, "layer {i}: {kind:?}");
        }
    }
    assert_eq!(configs[0].mixer_label(), "hla2+hla3+ahla+linear+softmax");
    assert_eq!(
        hybrid(vec![Hla2, Hla2, Softmax]).mixer_label(),
        "hla2×2+softmax"
    );
}

/// Checks each parameter's gradient: present, finite and not all zero.
struct GradCheck<'a> {
    grads: &'a GradientsParams,
    path: Vec<String>,
    checked: usize,
}

impl ModuleVisitor for GradCheck<'_> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let name = self.path.join(".");
        let grad = self
            .grads
            .get::<D>(param.id)
            .unwrap_or_else(|| panic!("{name}: no gradient"));
        let values = common::host(&grad);
        assert!(
            values.iter().all(|g| g.is_finite()),
            "{name}: non-finite gradient"
        );
        assert!(values.iter().any(|g| *g != 0.0), "{name}: zero gradient");
        self.checked += 1;
    }
}

#[test]
fn every_parameter_learns() {
    for device in devices() {
        let ad = device.clone().autodiff();
        for mixer in MIXERS {
            for config in variants(mixer) {
                ad.seed(17);
                let model = config.init(&ad);
                let mut rng = Rng::new(5);
                let ids = tokens(&mut rng, 3, 17, config.vocab_size, &ad);
                let (inputs, targets) =
                    (ids.clone().slice(s![.., 0..16]), ids.slice(s![.., 1..17]));
                let loss = model.loss(inputs.clone(), targets.clone());
                let before = loss.clone().into_scalar::<f32>();
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                let mut check = GradCheck {
                    grads: &grads,
                    path: Vec::new(),
                    checked: 0,
                };
                model.visit(&mut check);
                assert!(
                    check.checked > 10,
                    "{mixer:?}: visited only {} parameters",
                    check.checked
                );

                let mut optim = AdamWConfig::new().init();
                let model = optim.step(1e-3, model, grads);
                let after = model.loss(inputs, targets).into_scalar::<f32>();
                assert!(
                    after < before,
                    "{mixer:?}: loss {before} → {after} after one AdamW step ({config:?})"
                );
            }
        }
    }
}

/// `forward_at` gives the rows of `forward` at the flat positions asked for, and the
/// same gradients through them.
#[test]
fn forward_at_equals_forward_rows() {
    for device in devices() {
        let ad = device.clone().autodiff();
        for mixer in MIXERS {
            let config = tiny(mixer);
            let model = config.init(&ad);
            let mut rng = Rng::new(8);
            let ids = tokens(&mut rng, 2, 21, config.vocab_size, &ad);
            let at =
                Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 5, 20, 24, 41], [5]), &ad);
            let vocab = config.vocab_size;
            let weights = rng.tensor([5, vocab], 1.0, &ad);
            let rows = model
                .forward(ids.clone())
                .reshape([42, vocab])
                .select(0, at.clone());
            let part = model.forward_at(ids, at);
            let err = rel_rms(&part, &rows);
            assert!(
                err <= TOL,
                "{mixer:?}: forward_at vs forward rows {err:.3e}"
            );
            let grads = |logits: Tensor<2>| {
                param_grads(&model, &(logits * weights.clone()).sum().backward())
            };
            for (i, (full, sparse)) in grads(rows).iter().zip(&grads(part)).enumerate() {
                let err = rel_rms(sparse, full);
                assert!(
                    err <= TOL,
                    "{mixer:?}: parameter {i}: gradients differ by {err:.3e}"
                );
            }
        }
    }
}

/// Unnormalised HLA grows like t² without decay (docs/math.md §9); with the default recipe the
/// activations must stay finite at T = 4096 in f32.
#[test]
fn long_sequences_stay_finite_with_defaults() {
    let device = &devices()[0];
    for mixer in [
        MixerKind::Hla2,
        MixerKind::Hla3,
        MixerKind::Ahla,
        MixerKind::Linear,
    ] {
        let config = LmConfig::new(65).with_mixer(mixer);
        let model = config.init(device);
        let ids = tokens(&mut Rng::new(11), 1, 4096, 65, device);
        let logits = common::host(&model.forward(ids));
        assert!(
            logits.iter().all(|x| x.is_finite()),
            "{mixer:?}: non-finite logits at T = 4096"
        );
    }
}

/// The defaults train stably at T = 1024: a few AdamW steps on a repeating text lower the
/// loss and keep every value finite.
#[test]
fn defaults_train_stably_at_1024_tokens() {
    let device = devices()[0].clone().autodiff();
    let period: Vec<i64> = (0..37).map(|i| (i * 7 % 65) as i64).collect();
    let stream: Vec<i64> = period.iter().cycle().take(1025).copied().collect();
    let ids = Tensor::<2, Int>::from_data(TensorData::new(stream, [1, 1025]), &device);
    let (inputs, targets) = (
        ids.clone().slice(s![.., 0..1024]),
        ids.slice(s![.., 1..1025]),
    );
    for mixer in [MixerKind::Hla2, MixerKind::Hla3, MixerKind::Ahla] {
        device.seed(23);
        let mut model = LmConfig::new(65).with_mixer(mixer).init(&device);
        let mut optim = AdamWConfig::new().with_weight_decay(0.1).init();
        let mut losses = Vec::new();
        for _ in 0..6 {
            let loss = model.loss(inputs.clone(), targets.clone());
            losses.push(loss.clone().into_scalar::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(3e-3, model, grads);
        }
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{mixer:?}: {losses:?}"
        );
        assert!(
            losses[5] < losses[0] - 0.5,
            "{mixer:?}: the loss did not fall: {losses:?}"
        );
    }
}
