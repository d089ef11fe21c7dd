//! The optimizer and learning-rate schedule of a run.

use anyhow::Result;
use burn::lr_scheduler::LrSchedulerConfig;
use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::lr_scheduler::sequential::SequentialLrSchedulerConfig;
use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use hla_model::optim::AdamW;

use crate::run::config::{RunConfig, TrainSection};

/// AdamW with weight decay on matrices only (norm gains and other vectors are not decayed,
/// as nanoGPT), with `clip = "parameter"` each parameter's gradient clipped to the
/// `grad_clip` norm first: Burn's AdamW and clipping, fused into one kernel per parameter
/// on CPU devices (`hla_model::optim`). The global clip runs before it, in the
/// [`Trainee`](super::trainee::Trainee)'s step.
pub fn optimizer(t: &TrainSection, model: &impl Module) -> ModuleOptimizer {
    let adamw = |weight_decay: f64| AdamW {
        beta_1: t.beta1 as f32,
        beta_2: t.beta2 as f32,
        epsilon: AdamW::EPSILON,
        weight_decay: weight_decay as f32,
        clip_norm: t.parameter_clip().map(|c| c as f32),
    };
    let mut vectors = Vectors(Vec::new());
    model.visit(&mut vectors);
    ModuleOptimizer::from(adamw(t.weight_decay)).with_group(
        ParamGroup::from_ids(vectors.0),
        adamw(0.0),
        None,
    )
}

/// Collects the ids of one-dimensional parameters.
struct Vectors(Vec<ParamId>);

impl ModuleVisitor for Vectors {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if D == 1 {
            self.0.push(param.id);
        }
    }
}

/// Linear warm-up to `lr`, then cosine decay to `min_lr` (nanoGPT).
pub fn scheduler(config: &RunConfig) -> Result<ModuleLrScheduler> {
    let t = &config.train;
    let warmup = t.warmup_steps.min(t.steps.saturating_sub(1));
    let cosine = CosineAnnealingLrSchedulerConfig::new(t.lr, (t.steps - warmup).max(1))
        .with_min_lr(t.min_lr);
    let schedule = if warmup == 0 {
        cosine.init()
    } else {
        let warm = LinearLrSchedulerConfig::new(t.lr / warmup as f64, t.lr, warmup);
        SequentialLrSchedulerConfig::new(
            vec![
                LrSchedulerConfig::Linear(warm),
                LrSchedulerConfig::Cosine(cosine),
            ],
            vec![warmup],
        )
        .init()
    };
    schedule.map_err(|e| anyhow::anyhow!("the learning-rate schedule: {e}"))
}
