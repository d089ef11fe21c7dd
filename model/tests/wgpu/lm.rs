//! The language model on the wgpu device: a training step against ndarray, and the GPU
//! kernels against their composed forms end to end.

use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use hla_model::backend::{Kernels, set_kernels};
use hla_model::lm::{DecayKind, LmConfig};

use crate::common::{MIXERS, Rng, param_grads, rel_rms, tiny};
use crate::{TOL, cpu, gpu, kernels, to_cpu};

fn tokens(batch: usize, time: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let mut rng = Rng::new(5);
    let values: Vec<i64> = (0..batch * time)
        .map(|_| rng.between(0.0, vocab as f64) as i64)
        .collect();
    Tensor::from_data(TensorData::new(values, [batch, time]), device)
}

/// The loss of one AdamW step's batch, and the loss after the step.
fn train_step(config: &LmConfig, weights: burn::store::ModuleRecord, device: &Device) -> [f32; 2] {
    let ad = device.clone().autodiff();
    let model = config.init(&ad).load_record(weights);
    let ids = tokens(3, 17, config.vocab_size, &ad);
    let (inputs, targets) = (ids.clone().slice(s![.., 0..16]), ids.slice(s![.., 1..17]));
    let loss = model.loss(inputs.clone(), targets.clone());
    let before = loss.clone().into_scalar::<f32>();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let model = AdamWConfig::new().init().step(1e-3, model, grads);
    [before, model.loss(inputs, targets).into_scalar::<f32>()]
}

/// The same weights (initialised on the CPU: seeded initialisation differs by backend)
/// give the same loss on both devices, before and after one AdamW step.
#[test]
fn lm_training_step_matches_the_cpu() {
    let _switch = kernels(Kernels::default());
    for mixer in MIXERS {
        let config = tiny(mixer);
        let cpu = cpu();
        cpu.seed(17);
        let weights = config.init(&cpu).into_record();
        let want = train_step(&config, weights.clone(), &cpu);
        let got = train_step(&config, weights, &gpu());
        for (g, w) in got.iter().zip(&want) {
            let err = f64::from((g - w).abs() / w.abs());
            assert!(
                err <= TOL,
                "{mixer:?}: loss {g} on wgpu, {w} on ndarray (before, after the step: {got:?} vs {want:?})"
            );
        }
        assert!(
            want[1] < want[0],
            "{mixer:?}: the step lowered no loss: {want:?}"
        );
    }
}

/// End to end on the GPU: for every mixer with GPU kernels, one language model's loss and
/// the gradient of every parameter are the same with the kernels on and off (their
/// composed forms).
#[test]
fn gpu_kernels_change_no_loss_and_no_gradient() {
    let _switch = kernels(Kernels::All);
    let ad = gpu().autodiff();
    let mixers = MIXERS
        .into_iter()
        .filter(|m| m.has_kernels(DecayKind::Fixed, &ad));
    for mixer in mixers {
        let config = tiny(mixer);
        ad.seed(3);
        let lm = config.init(&ad);
        let ids = tokens(3, 22, config.vocab_size, &ad);
        let (inputs, targets) = (ids.clone().slice(s![.., 0..21]), ids.slice(s![.., 1..22]));
        let mut runs = Vec::new();
        for kernels in [Kernels::All, Kernels::None] {
            set_kernels(kernels);
            let loss = lm.loss(inputs.clone(), targets.clone());
            let grads = param_grads(&lm, &loss.backward());
            runs.push((
                to_cpu(loss.inner()),
                grads.into_iter().map(to_cpu).collect::<Vec<_>>(),
            ));
        }
        let ((loss, grads), (want_loss, want_grads)) = (&runs[0], &runs[1]);
        let error = rel_rms(loss, want_loss);
        assert!(error < 1e-5, "{mixer:?}: loss error {error:e}");
        for (i, (g, w)) in grads.iter().zip(want_grads).enumerate() {
            let error = rel_rms(g, w);
            assert!(
                error < 1e-4,
                "{mixer:?}: parameter {i}: gradient error {error:e}"
            );
        }
    }
}
