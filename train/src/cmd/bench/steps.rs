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

use super::{Bench, Forms, Route, Timing, in_rounds, launches};
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
    /// Hybrid stacks measured beside the plain mixers when no mixer is picked.
    hybrids: &'static [[MixerKind; 4]],
}

/// nanoGPT's CPU configuration (`configs/shakespeare-char-*.toml`), one sequence of 2048
/// tokens, two at a GPT-2 vocabulary in GPT-2's recipe (learned positions, LayerNorm,
/// GELU MLP): `configs/sotu-gpt2-hla2.toml`'s shape and a wider, deeper, longer one, and
/// the Gutenberg study's (`configs/gutenberg-bpe-hla2.toml`) with its two hybrids.
pub(super) const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "nanogpt",
        batch: 12,
        context: 64,
        vocab: CHARS,
        model: LmConfig::default,
        hybrids: &[],
    },
    Workload {
        name: "long",
        batch: 1,
        context: 2048,
        vocab: CHARS,
        model: LmConfig::default,
        hybrids: &[],
    },
    Workload {
        name: "gpt2-small",
        batch: 16,
        context: 256,
        vocab: GPT2_VOCAB,
        model: || gpt2_recipe(256, 4, 4, 256),
        hybrids: &[],
    },
    Workload {
        name: "wide",
        batch: 8,
        context: 512,
        vocab: GPT2_VOCAB,
        model: || gpt2_recipe(512, 8, 8, 512),
        hybrids: &[],
    },
    Workload {
        name: "gutenberg",
        batch: 8,
        context: 512,
        vocab: 8192,
        model: || LmConfig {
            d_model: 256,
            n_layers: 4,
            n_heads: 4,
            ..LmConfig::default()
        },
        hybrids: &[
            [
                MixerKind::Hla2,
                MixerKind::Hla2,
                MixerKind::Softmax,
                MixerKind::Hla2,
            ],
            [
                MixerKind::Hla2,
                MixerKind::Hla2,
                MixerKind::Hla2,
                MixerKind::Softmax,
            ],
        ],
    },
];

impl Workload {
    /// The models of `mixers` (empty: every mixer, then the hybrids) at this workload.
    fn models(&self, mixers: &[MixerKind]) -> Vec<LmConfig> {
        let base = LmConfig {
            vocab_size: self.vocab,
            ..(self.model)()
        };
        let all: Vec<MixerKind> = MixerKind::NAMES
            .iter()
            .map(|name| name.parse().expect("a mixer's own name"))
            .collect();
        let plain = if mixers.is_empty() { &all } else { mixers };
        let hybrids = if mixers.is_empty() { self.hybrids } else { &[] };
        let plain = plain.iter().map(|&mixer| LmConfig {
            mixer,
            ..base.clone()
        });
        let hybrids = hybrids.iter().map(|layers| LmConfig {
            layers: Some(layers.to_vec()),
            ..base.clone()
        });
        plain.chain(hybrids).collect()
    }
}

/// The workloads' names, as `--workload` takes them.
pub(super) const WORKLOAD_NAMES: [&str; 5] = ["nanogpt", "long", "gpt2-small", "wide", "gutenberg"];

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The `gutenberg` workload is the study's model (its runs have 5,273,856 parameters
    /// whatever the mixer), with its two hybrids beside the plain mixers unless some are
    /// picked.
    #[test]
    fn the_gutenberg_workload_is_the_studys_model_and_hybrids() {
        let workload = WORKLOADS.iter().find(|w| w.name == "gutenberg").unwrap();
        let labels = |models: &[LmConfig]| -> Vec<String> {
            models.iter().map(LmConfig::mixer_label).collect()
        };
        let all = workload.models(&[]);
        assert_eq!(
            labels(&all[all.len() - 2..]),
            ["hla2×2+softmax+hla2", "hla2×3+softmax"]
        );
        assert_eq!(all.len(), MixerKind::NAMES.len() + 2);
        let device = Device::default();
        for model in [&all[0], &all[all.len() - 1]] {
            assert_eq!(model.init(&device).num_params(), 5_273_856, "{model:?}");
        }
        let picked = workload.models(&[MixerKind::Hla2]);
        assert_eq!(labels(&picked), ["hla2"]);
        assert!(
            WORKLOADS
                .iter()
                .all(|w| w.name == "gutenberg" || w.hybrids.is_empty())
        );
    }
}
