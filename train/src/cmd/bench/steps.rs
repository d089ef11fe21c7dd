//! The train section: whole optimizer steps as `hla train` runs them (chunked forward, loss,
//! backward, gradient clipping, AdamW with its parameter groups), for every mixer on
//! nanoGPT's CPU configuration and on a long context, with random tokens (no data loader).

use std::time::Instant;

use anyhow::{Context, Result};
use burn::data::dataloader::batcher::Batcher;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use burn::train::TrainStep;
use hla_data::batch::{LmBatch, LmBatcher};
use hla_data::windows::LmItem;
use hla_model::backend::{Kernels, set_kernels};
use hla_model::lm::{LmConfig, MixerKind, MlpKind, NormKind, Positions};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Bench, Route, Timing, in_rounds, launches};
use crate::alloc;
use crate::run::config::TrainSection;
use crate::run::trainer::trainee::{NanGuard, Trainee};

/// A model and batch shape of the train section.
pub(super) struct Workload {
    pub(super) name: &'static str,
    pub(super) batch: usize,
    pub(super) context: usize,
    pub(super) vocab: usize,
    /// The model of every mixer (the mixer and the vocabulary are set per case).
    model: fn() -> LmConfig,
}

/// nanoGPT's CPU configuration (`configs/shakespeare-char-*.toml`), one sequence of 2048
/// tokens, and two at a GPT-2 vocabulary in GPT-2's recipe (learned positions, LayerNorm,
/// GELU MLP): `configs/sotu-gpt2-hla2.toml`'s shape and a wider, deeper, longer one.
pub(super) const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "nanogpt",
        batch: 12,
        context: 64,
        vocab: CHARS,
        model: LmConfig::default,
    },
    Workload {
        name: "long",
        batch: 1,
        context: 2048,
        vocab: CHARS,
        model: LmConfig::default,
    },
    Workload {
        name: "gpt2-small",
        batch: 16,
        context: 256,
        vocab: GPT2_VOCAB,
        model: || gpt2_recipe(256, 4, 4, 256),
    },
    Workload {
        name: "wide",
        batch: 8,
        context: 512,
        vocab: GPT2_VOCAB,
        model: || gpt2_recipe(512, 8, 8, 512),
    },
];

/// The workloads' names, as `--workload` takes them.
pub(super) const WORKLOAD_NAMES: [&str; 4] = ["nanogpt", "long", "gpt2-small", "wide"];

/// Tiny-shakespeare's characters.
const CHARS: usize = 65;
/// GPT-2's BPE vocabulary.
const GPT2_VOCAB: usize = 50257;

/// GPT-2's block (the PyTorch cross-check's): learned positions for `context` tokens,
/// LayerNorm, a 4× GELU MLP.
fn gpt2_recipe(d_model: usize, n_layers: usize, n_heads: usize, context: usize) -> LmConfig {
    LmConfig {
        d_model,
        n_layers,
        n_heads,
        positions: Positions::Learned,
        norm: NormKind::Layer,
        mlp_kind: MlpKind::Gelu,
        max_seq_len: context,
        ..LmConfig::default()
    }
}

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
    mixer: MixerKind,
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
        mixer: MixerKind,
        route: Route,
        device: &Device,
        seed: u64,
    ) -> Self {
        let model = LmConfig {
            vocab_size: workload.vocab,
            mixer,
            ..(workload.model)()
        };
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
            mixer,
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
            mixer: self.mixer.name().into(),
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
    /// Every workload and mixer (empty lists: all; with `composed`, each also with the
    /// fused kernels off, and each HLA mixer with its node): warm-up steps, then rounds of one step per case still short of
    /// its repetitions (3 when `quick`), so the machine's slow spells spread over every
    /// case.
    pub(super) fn train_steps(
        &self,
        mixers: &[MixerKind],
        workloads: &[String],
        composed: bool,
        quick: bool,
    ) -> Result<Vec<TrainRow>> {
        let autodiff = self.device.clone().autodiff();
        let mut cases = self.cases(mixers, workloads, composed, &autodiff);
        let mut reps = Vec::with_capacity(cases.len());
        for case in &mut cases {
            eprintln!(
                "train {} {} {} warm-up",
                case.workload.name,
                case.mixer.name(),
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

    /// The cases of `mixers` (empty: all) on `workloads` (empty: all), on the autodiff
    /// device `autodiff`, each fused where it has kernels, and with `composed` also
    /// composed and (an HLA mixer) with its node.
    fn cases(
        &self,
        mixers: &[MixerKind],
        workloads: &[String],
        composed: bool,
        autodiff: &Device,
    ) -> Vec<Case> {
        let all: Vec<MixerKind> = MixerKind::NAMES
            .iter()
            .map(|name| name.parse().expect("a mixer's own name"))
            .collect();
        let mixers = if mixers.is_empty() { &all } else { mixers };
        let mut cases = Vec::new();
        let wanted = |w: &Workload| workloads.is_empty() || workloads.iter().any(|n| n == w.name);
        for workload in WORKLOADS.iter().filter(|w| wanted(w)) {
            for &mixer in mixers {
                let fused = mixer.has_kernels((workload.model)().decay, &self.device);
                // Without fused kernels for it there, the plain case is composed.
                let mut routes = vec![if fused {
                    Route::Kernels
                } else {
                    Route::Composed
                }];
                if composed && mixer != MixerKind::Softmax {
                    routes.push(Route::Node);
                }
                if composed && fused {
                    routes.push(Route::Composed);
                }
                for route in routes {
                    let seed = cases.len() as u64;
                    cases.push(Case::new(workload, mixer, route, autodiff, seed));
                }
            }
        }
        cases
    }
}

fn chars() -> usize {
    CHARS
}
