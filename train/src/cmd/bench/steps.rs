//! The train section: whole optimizer steps as `hla train` runs them (chunked forward, loss,
//! backward, gradient clipping, AdamW with its parameter groups), for every mixer on the
//! workloads of [`super::workloads`], with random tokens (no data loader).

use std::time::Instant;

use anyhow::{Context, Result};
use burn::data::dataloader::batcher::Batcher;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use burn::train::TrainStep;
use hla_data::batch::{LmBatch, LmBatcher};
use hla_data::windows::LmItem;
use hla_model::backend::{Kernels, set_kernels};
use hla_model::lm::{LmConfig, MixerKind};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::workloads::{CHARS, WORKLOADS, Workload};
use super::{Bench, Forms, Route, Timing, in_rounds, launches};
use crate::alloc;
use crate::run::config::TrainSection;
use crate::run::trainer::trainee::{NanGuard, Trainee};

/// Seconds of timed steps per case: this machine's slow spells last seconds, so a
/// median needs more than the operators' budget.
const BUDGET_S: f64 = 5.0;

/// Steps for about [`BUDGET_S`] of steps taking `warm` seconds, 3 to 40 (the steps of a
/// GPT-2 vocabulary take seconds).
fn repetitions(warm: f64) -> usize {
    ((BUDGET_S / warm.max(1e-6)) as usize).clamp(3, 40)
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct TrainRow {
    pub(super) workload: String,
    pub(super) mixer: String,
    pub(super) batch: usize,
    pub(super) context: usize,
    /// The vocabulary (figures from before it was recorded: tiny-shakespeare's).
    #[serde(default = "chars")]
    pub(super) vocab: usize,
    pub(super) parameters: usize,
    /// Whether the fused kernels ran (the CPU kernels, or on a GPU the chunked HLA's; off:
    /// every op's composed form, or the node).
    pub(super) fused: bool,
    /// Whether the chunked HLA ran as its node (`Kernels::Nodes`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) node: bool,
    pub(super) steps_per_s: f64,
    pub(super) tokens_per_s: f64,
    /// Median seconds of the forward pass with the loss, of the backward pass, and of
    /// the optimizer step (clipping and AdamW).
    pub(super) phases_s: [f64; 3],
    pub(super) timing: Timing,
    /// Kernels launched by one step on a GPU device (none on the CPU devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) launches: Option<usize>,
}

impl TrainRow {
    /// Which form its step ran.
    pub(super) fn route(&self) -> Route {
        match (self.fused, self.node) {
            (true, _) => Route::Kernels,
            (false, true) => Route::Node,
            (false, false) => Route::Composed,
        }
    }
}

/// One model training on one batch, with the kernels of `route`.
struct Case {
    workload: &'static Workload,
    /// The stack's mixers in words (`hla2`, `hla2×3+softmax`).
    label: String,
    route: Route,
    parameters: usize,
    /// Kernels one step launched, counted on a warm-up step.
    launches: Option<usize>,
    trainee: Option<Trainee>,
    optimizer: ModuleOptimizer,
    batch: LmBatch,
}

impl Case {
    fn new(
        workload: &'static Workload,
        model: LmConfig,
        route: Route,
        device: &Device,
        seed: u64,
    ) -> Self {
        let lm = model.init(device);
        let trainee = Trainee {
            lm,
            guard: NanGuard::default(),
            gradient_scale: 1.0,
            global_clip: TrainSection::default().global_clip(),
        };
        let optimizer = crate::run::trainer::optim::optimizer(&TrainSection::default(), &trainee);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let items = (0..workload.batch)
            .map(|_| {
                let tokens: Vec<u32> = (0..=workload.context)
                    .map(|_| rng.random_range(0..workload.vocab as u32))
                    .collect();
                LmItem {
                    inputs: tokens[..workload.context].to_vec(),
                    targets: tokens[1..].to_vec(),
                    mask: vec![true; workload.context],
                }
            })
            .collect();
        Self {
            workload,
            label: model.mixer_label(),
            route,
            parameters: trainee.lm.num_params(),
            launches: None,
            trainee: Some(trainee),
            optimizer,
            batch: LmBatcher.batch(items, device),
        }
    }

    /// One optimizer step; returns the seconds of its phases (forward, backward,
    /// optimizer) and its peak heap bytes.
    fn step(&mut self, device: &Device) -> Result<([f64; 3], usize)> {
        set_kernels(self.route.kernels());
        let trainee = self
            .trainee
            .take()
            .expect("the model is back after every step");
        let wait = || device.sync().context("waiting for the device");
        let base = alloc::reset_peak();
        let start = Instant::now();
        let loss = trainee.forward_batch(self.batch.clone()).loss;
        wait()?;
        let forward = start.elapsed().as_secs_f64();
        let grads = GradientsParams::from_grads(loss.backward(), &trainee);
        wait()?;
        let backward = start.elapsed().as_secs_f64() - forward;
        let lr = TrainSection::default().lr;
        let trainee = trainee.optimize(&mut self.optimizer, lr.into(), grads);
        wait()?;
        let optimizer = start.elapsed().as_secs_f64() - forward - backward;
        self.trainee = Some(trainee);
        Ok(([forward, backward, optimizer], alloc::peak() - base))
    }

    /// The row of this case's timed steps (the seconds of their phases) and peak heap bytes.
    fn row(&self, runs: &[[f64; 3]], peak_bytes: Option<usize>) -> TrainRow {
        let phase = |i: usize| Timing::of(runs.iter().map(|p| p[i]).collect(), None);
        let phases_s = [0, 1, 2].map(|i| phase(i).median_s);
        let totals = runs.iter().map(|p| p.iter().sum()).collect();
        let timing = Timing::of(totals, peak_bytes);
        let w = self.workload;
        TrainRow {
            workload: w.name.into(),
            mixer: self.label.clone(),
            batch: w.batch,
            context: w.context,
            vocab: w.vocab,
            parameters: self.parameters,
            fused: self.route == Route::Kernels,
            node: self.route == Route::Node,
            steps_per_s: 1.0 / timing.median_s,
            tokens_per_s: (w.batch * w.context) as f64 / timing.median_s,
            phases_s,
            timing,
            launches: self.launches,
        }
    }
}

impl Bench {
    /// Every workload and mixer (empty lists: all), each in `forms`: warm-up steps, then
    /// rounds of one step per case still short of its repetitions (3 when `quick`), so the
    /// machine's slow spells spread over every case.
    pub(super) fn train_steps(
        &self,
        mixers: &[MixerKind],
        workloads: &[String],
        forms: &Forms,
        quick: bool,
    ) -> Result<Vec<TrainRow>> {
        let autodiff = self.device.clone().autodiff();
        let mut cases = self.cases(mixers, workloads, forms, &autodiff);
        let mut reps = Vec::with_capacity(cases.len());
        for case in &mut cases {
            eprintln!(
                "train {} {} {} warm-up",
                case.workload.name,
                case.label,
                case.route.form()
            );
            case.step(&autodiff)?;
            // The second step: the first also launches autotune's candidates.
            let (warm, launches) = launches::count(&autodiff, || case.step(&autodiff));
            let warm = warm?.0.iter().sum();
            case.launches = launches;
            reps.push(if quick { 3 } else { repetitions(warm) });
        }
        let measured = in_rounds("train steps", &reps, |c| cases[c].step(&autodiff))?;
        set_kernels(Kernels::default());
        Ok(cases
            .iter()
            .zip(measured)
            .map(|(case, (runs, peak))| case.row(&runs, self.host_memory.then_some(peak)))
            .collect())
    }

    /// The cases of `mixers` (empty: all, and each workload's hybrids) on `workloads`
    /// (empty: all), on the autodiff device `autodiff`, each in `forms`.
    fn cases(
        &self,
        mixers: &[MixerKind],
        workloads: &[String],
        forms: &Forms,
        autodiff: &Device,
    ) -> Vec<Case> {
        let wanted = |w: &Workload| workloads.is_empty() || workloads.iter().any(|n| n == w.name);
        let mut cases = Vec::new();
        for workload in WORKLOADS.iter().filter(|w| wanted(w)) {
            for model in workload.models(mixers) {
                for route in self.routes(&model, forms) {
                    let seed = cases.len() as u64;
                    cases.push(Case::new(workload, model.clone(), route, autodiff, seed));
                }
            }
        }
        cases
    }

    /// The forms `model`'s step runs in ([`Forms::routes`]): it has kernels where a layer
    /// has, and a node where a layer is linear-time.
    fn routes(&self, model: &LmConfig, forms: &Forms) -> Vec<Route> {
        let linear_time = model.mixers().iter().any(|&m| m != MixerKind::Softmax);
        let fused = model
            .mixers()
            .iter()
            .any(|m| m.has_kernels(model.decay, &self.device));
        forms.routes(fused, linear_time)
    }
}

fn chars() -> usize {
    CHARS
}
