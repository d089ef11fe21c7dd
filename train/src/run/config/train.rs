//! `[train]`: optimisation, evaluation, checkpoints and devices of a run config.

use anyhow::{Result, bail};
use hla_model::backend::Kernels;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::run::devices::{self, Spec};

/// `[train]`: optimisation, evaluation, checkpoints and devices (defaults: nanoGPT's CPU
/// run on one device).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Tokens per training window (text); MQAR uses its own lengths.
    pub context: usize,
    /// Examples per batch, over all devices together (each takes an equal share).
    pub batch_size: usize,
    /// Optimiser steps.
    pub steps: usize,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: usize,
    /// AdamW weight decay, applied to matrices only.
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// The gradient-norm limit of the clipping `clip` says; 0 turns clipping off.
    pub grad_clip: f64,
    /// Which norm `grad_clip` limits.
    pub clip: Clip,
    /// Batches per optimiser step; the gradient is their mean.
    pub grad_accumulation: usize,
    /// Steps between validations, each followed by a checkpoint.
    pub eval_interval: usize,
    /// Batches of nanoGPT's random-window validation estimate.
    pub eval_batches: usize,
    /// Checkpoints kept besides the best (at least the last, to resume from).
    pub keep_checkpoints: usize,
    /// Stop after this many validations without improvement; 0 never stops early.
    pub early_stopping: usize,
    pub seed: u64,
    /// Devices to train on, e.g. `["cuda:0", "cuda:1"]`; empty: the command's `--device`.
    /// With several, each batch is split evenly between them (data parallel).
    pub devices: Vec<String>,
    /// How several devices train together.
    pub strategy: Strategy,
    /// Which form the mixers' ops run in: the same numbers (within 1e-4), other kernels.
    pub form: Form,
}

/// What `train.grad_clip` limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clip {
    /// The L2 norm of all of a step's gradients together, as PyTorch's `clip_grad_norm_`
    /// and nanoGPT: past the limit, every gradient is scaled by one factor.
    Global,
    /// Each parameter's gradient norm on its own (Burn's `GradientClipping::Norm`; the
    /// project's runs before the global clip).
    Parameter,
}

/// burn-train's execution strategy for several devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// One model; each device computes the gradient of its share, the first device adds
    /// them up and steps the optimiser (`ExecutionStrategy::multi`, any backend).
    Multi,
    /// A model per device, gradients all-reduced between them (`ExecutionStrategy::ddp`,
    /// NCCL: CUDA devices only).
    Ddp,
}

/// Which form a run's ops take (`train.form`): what `hla bench --form` and `hla verify
/// --form` measure and check, for training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The device's default (`Kernels::Auto`): the CPU kernels on CPU devices; on GPU
    /// devices the chunked HLA's node and the attention's kernels.
    Auto,
    /// The hand-written kernels, the GPU's too.
    Fused,
    /// The chunked HLA's node (one autodiff node, its fused kernels on a GPU device).
    Node,
    /// Burn's ops alone.
    Composed,
}

impl Form {
    /// The kernels a run of this form sets, process-wide, while it trains.
    pub fn kernels(self) -> Kernels {
        match self {
            Self::Auto => Kernels::default(),
            Self::Fused => Kernels::All,
            Self::Node => Kernels::Nodes,
            Self::Composed => Kernels::None,
        }
    }
}

/// [`hla_model::config_names!`] and serde, by the lowercase names config files use.
macro_rules! by_name {
    ($ty:ty { $($names:tt)+ }) => {
        hla_model::config_names!($ty { $($names)+ });

        /// By its name in config files.
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?
                    .parse()
                    .map_err(serde::de::Error::custom)
            }
        }
    };
}

by_name!(Strategy { Multi => "multi", Ddp => "ddp" });
by_name!(Clip { Global => "global", Parameter => "parameter" });
by_name!(Form { Auto => "auto", Fused => "fused", Node => "node", Composed => "composed" });

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            context: 64,
            batch_size: 12,
            steps: 2000,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            grad_clip: 1.0,
            clip: Clip::Global,
            grad_accumulation: 1,
            eval_interval: 250,
            eval_batches: 20,
            keep_checkpoints: 2,
            early_stopping: 0,
            seed: 1337,
            devices: Vec::new(),
            strategy: Strategy::Multi,
            form: Form::Auto,
        }
    }
}

impl TrainSection {
    /// Every check of the section that needs neither the data nor the devices.
    pub fn validate(&self) -> Result<()> {
        let positive = |key: &str, value: f64| -> Result<()> {
            if !(value.is_finite() && value > 0.0) {
                bail!("train.{key} must be positive and finite, got {value}");
            }
            Ok(())
        };
        positive("lr", self.lr)?;
        // Burn's learning-rate schedulers take no rate above 1.
        if self.lr > 1.0 {
            bail!("train.lr must be at most 1, got {}", self.lr);
        }
        if !(self.min_lr.is_finite() && (0.0..=self.lr).contains(&self.min_lr)) {
            bail!(
                "train.min_lr must be between 0 and train.lr, got {}",
                self.min_lr
            );
        }
        for (key, value) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&value) {
                bail!("train.{key} must be in [0, 1), got {value}");
            }
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            bail!("train.weight_decay must be ≥ 0, got {}", self.weight_decay);
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            bail!(
                "train.grad_clip must be ≥ 0 (0: off), got {}",
                self.grad_clip
            );
        }
        for (key, value) in [
            ("context", self.context),
            ("batch_size", self.batch_size),
            ("steps", self.steps),
            ("grad_accumulation", self.grad_accumulation),
            ("eval_interval", self.eval_interval),
            ("eval_batches", self.eval_batches),
            ("keep_checkpoints", self.keep_checkpoints),
        ] {
            if value == 0 {
                bail!("train.{key} must be at least 1, got 0");
            }
        }
        if !self.steps.is_multiple_of(self.eval_interval) {
            bail!(
                "train.steps ({}) must be a multiple of train.eval_interval ({}): training runs \
                 in whole validation intervals",
                self.steps,
                self.eval_interval
            );
        }
        self.validate_devices()
    }

    /// Device names, the even split of each batch, and what DDP needs.
    fn validate_devices(&self) -> Result<()> {
        let specs = self
            .devices
            .iter()
            .map(|name| name.parse::<Spec>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("train.devices: {e}"))?;
        let n = specs.len().max(1);
        if !self.batch_size.is_multiple_of(n) {
            bail!(
                "train.batch_size ({}) must be a multiple of the number of devices ({n}): each \
                 device takes an equal share of every batch",
                self.batch_size
            );
        }
        if self.strategy == Strategy::Ddp && !(n > 1 && specs.iter().all(Spec::is_cuda)) {
            bail!(
                "train.strategy = \"ddp\" needs several CUDA devices in train.devices (cuda:0, \
                 cuda:1, …): Burn all-reduces gradients with NCCL; use \"multi\" on other devices"
            );
        }
        Ok(())
    }

    /// The limit of the global gradient norm, when the run clips it.
    pub fn global_clip(&self) -> Option<f64> {
        (self.clip == Clip::Global && self.grad_clip > 0.0).then_some(self.grad_clip)
    }

    /// The limit of each parameter's gradient norm, when the run clips them one by one.
    pub fn parameter_clip(&self) -> Option<f64> {
        (self.clip == Clip::Parameter && self.grad_clip > 0.0).then_some(self.grad_clip)
    }

    /// Examples each device computes per batch.
    pub fn batch_per_device(&self) -> usize {
        self.batch_size / self.devices.len().max(1)
    }

    /// What a run says of its form: nothing for the device's default, else `, the <form>
    /// form`.
    pub fn form_note(&self) -> String {
        match self.form {
            Form::Auto => String::new(),
            form => format!(", the {} form", form.name()),
        }
    }

    /// How `hla info` and the start of a run describe the devices, the batch and the form.
    pub fn describe_devices(&self) -> String {
        let names = &self.devices;
        let n = names.len().max(1);
        let per_step = self.batch_size * self.grad_accumulation;
        let form = self.form_note();
        if n == 1 {
            let device = names.first().map_or(devices::default_name(), |d| d);
            return format!(
                "{device}: batch {}, {per_step} examples per optimiser step{form}",
                self.batch_size
            );
        }
        format!(
            "{} ({}): batch {} = {n} × {} per device, {per_step} examples per optimiser \
             step{form}",
            names.join(", "),
            self.strategy.name(),
            self.batch_size,
            self.batch_per_device(),
        )
    }
}
