//! The language model's configuration: every option, its checks, and the model it builds.

mod names;
mod validate;

use burn::module::Initializer;
use burn::nn::{DropoutConfig, EmbeddingConfig, LinearConfig};
use burn::prelude::*;
use burn::serde::{Deserialize, Serialize};

use super::block::Block;
use super::{Lm, norm};
use crate::hla::Form;
use names::{by_name, by_name_list, by_name_opt};
pub use validate::ConfigError;

/// The token mixer of a block.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum MixerKind {
    /// Second-order HLA.
    Hla2,
    /// Third-order HLA.
    Hla3,
    /// Asymmetric second-order HLA.
    Ahla,
    /// First-order linear attention.
    Linear,
    /// Causal softmax attention with RoPE.
    Softmax,
}

impl MixerKind {
    /// Whether the CPU or GPU kernels run this mixer's training step on `device` with `decay`:
    /// every mixer's on a CPU device; on a GPU device (wgpu, cuda) the causal attention's
    /// and the chunked HLA forms' of every order, for gates that need no gradient (not
    /// [`DecayKind::Gated`]).
    pub fn has_kernels(&self, decay: DecayKind, device: &Device) -> bool {
        crate::backend::on_cpu(device)
            || (crate::backend::on_gpu(device)
                && (*self == Self::Softmax || decay != DecayKind::Gated))
    }
}

/// The map applied to queries and keys before HLA or linear attention.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum FeatureMap {
    /// Unit L2 norm per head (the HLA default).
    L2,
    /// Queries scaled by 1/√d.
    Scale,
    /// `elu(x) + 1` (the linear-attention default).
    EluPlusOne,
    /// Raw q and k, as the paper writes HLA.
    Identity,
}

/// The decay of HLA and linear attention.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum DecayKind {
    None,
    /// Fixed multi-scale decay per head, `γ_h = 1 − 2^(−b−h)` with `b = decay_base` (RetNet:
    /// `b = 5`).
    Fixed,
    /// Data-dependent gate per head and token, `log g = log σ(W x) / 16`.
    Gated,
}

/// Where the model takes token positions from.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Positions {
    /// RoPE inside softmax attention; HLA and linear attention take order from their
    /// recurrence (and the short convolution) and get no position signal.
    Rope,
    /// GPT-2's learned absolute positions, `max_seq_len` of them, added to the token
    /// embedding, for every mixer (softmax attention without RoPE).
    Learned,
}

/// The feed-forward after each mixer.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum MlpKind {
    /// `down(silu(W₁ x) ⊙ W₂ x)`, hidden width 8/3 of d_model by default.
    Swiglu,
    /// GPT-2's `down(gelu(W x))` (tanh-free, exact GELU), hidden width 4·d_model by default.
    Gelu,
}

/// The norm before each mixer and MLP and before the output head (the per-head output norm
/// of HLA and linear attention stays an RMSNorm).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// RMSNorm, ε = 1e-5.
    Rms,
    /// LayerNorm without bias (nanoGPT's), ε = 1e-5.
    Layer,
}

/// A language-model configuration; the defaults are the recipe that trained best on
/// tiny-shakespeare here (experiments/shakespeare-char-full): fixed multi-scale decay at
/// b = 0.5, short convolution, and per mixer either L2 q/k with a per-head output RMSNorm
/// (hla2; linear attention with elu + 1) or the ratio normalisation (hla3, AHLA).
///
/// Two serde forms. Its `Serialize` and `Deserialize` (Burn's `Config`) write every field,
/// the enums by their Rust names (`"Hla2"`). The associated functions
/// `LmConfig::serialize` and `LmConfig::deserialize` (`#[serde(with = "LmConfig")]`) are
/// the `[model]` section of a config file: every key but `vocab_size` (which comes from
/// the data), each optional with its default, the enums by their names in config files
/// (`"hla2"`), unset options left out, unknown keys rejected; messages call it
/// `ModelSection`.
#[derive(Config, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    crate = "burn::serde",
    remote = "Self",
    expecting = "struct ModelSection",
    deny_unknown_fields,
    default
)]
pub struct LmConfig {
    /// Not a key of the `[model]` section: the vocabulary comes from the data.
    #[serde(skip)]
    pub vocab_size: usize,
    /// The mixer of every layer (a uniform stack); with `layers`, left at its default.
    #[config(default = "MixerKind::Hla2")]
    #[serde(with = "by_name")]
    pub mixer: MixerKind,
    /// One mixer per layer, `n_layers` of them, first layer first (a hybrid stack, e.g.
    /// three HLA layers then softmax attention); `None`: `mixer` in every layer. The other
    /// keys apply to every layer, each mixer taking what it uses (the mixer-dependent
    /// defaults of `feature_map`, `normalize` and `output_norm` per layer).
    #[config(default = "None")]
    #[serde(with = "by_name_list", skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<MixerKind>>,
    #[config(default = 128)]
    pub d_model: usize,
    #[config(default = 4)]
    pub n_layers: usize,
    #[config(default = 4)]
    pub n_heads: usize,
    /// `None`: the mixer's default (elu + 1 for linear attention and wherever the masked
    /// denominator is on, which needs nonnegative features; L2 for HLA otherwise).
    #[config(default = "None")]
    #[serde(with = "by_name_opt", skip_serializing_if = "Option::is_none")]
    pub feature_map: Option<FeatureMap>,
    #[config(default = "DecayKind::Fixed")]
    #[serde(with = "by_name")]
    pub decay: DecayKind,
    /// `b` of the fixed decay `γ_h = 1 − 2^(−b−h)`: head `h` forgets on a scale of about
    /// `2^(b+h)` tokens. The default 0.5 trained best of b ∈ {0.5, 1, 2, 3, 5} for every
    /// linear-time mixer on tiny-shakespeare (experiments/shakespeare-char-full; 0.25 gave
    /// hla2 no more); RetNet's is 5, which recall (MQAR) needs.
    #[config(default = 0.5)]
    pub decay_base: f64,
    /// Kernel of the short causal convolution on q, k, v; 0 turns it off.
    #[config(default = 4)]
    pub short_conv: usize,
    /// The per-head output RMSNorm of HLA and linear attention; `None`: on unless the
    /// output is divided by the masked denominator (`normalize`).
    #[config(default = "None")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_norm: Option<bool>,
    #[config(default = false)]
    pub output_gate: bool,
    /// One key per layer shared by all heads (multi-query, docs/math.md §11).
    #[config(default = false)]
    pub shared_keys: bool,
    /// Divide by the masked denominator (docs/math.md §3). Meant for a nonnegative feature map
    /// (`elu_plus_one`): with signed q and k the denominator can cross zero, and the output
    /// jumps where it does (docs/math.md §9). `None`: the mixer's default, on for HLA and linear
    /// attention (see [`ratio_by_default`](Self::ratio_by_default)).
    #[config(default = "None")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
    #[config(default = 64)]
    pub chunk_size: usize,
    /// Most tokens computed chunk-parallel in one pass (rounded down to whole chunks);
    /// longer inputs run in passes that carry the state (see [`Form::Segmented`]). 0: the
    /// whole sequence in one pass, the fastest (the segment sweep of `hla bench`).
    #[config(default = 0)]
    pub segment_size: usize,
    /// An MLP after each mixer; `false`: mixers only (Zoology's MQAR models).
    #[config(default = true)]
    pub mlp: bool,
    #[config(default = "MlpKind::Swiglu")]
    #[serde(with = "by_name")]
    pub mlp_kind: MlpKind,
    /// Hidden width of the MLP; 0: 8/3 of d_model rounded up to a multiple of 16 (SwiGLU),
    /// 4·d_model (GELU).
    #[config(default = 0)]
    pub d_ff: usize,
    #[config(default = "NormKind::Rms")]
    #[serde(with = "by_name")]
    pub norm: NormKind,
    #[config(default = "Positions::Rope")]
    #[serde(with = "by_name")]
    pub positions: Positions,
    #[config(default = 0.0)]
    pub dropout: f64,
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// Longest sequence of a softmax model (its RoPE table) or of learned positions.
    #[config(default = 4096)]
    pub max_seq_len: usize,
    /// Standard deviation of the initial weights (nanoGPT, fla: 0.02).
    #[config(default = 0.02)]
    pub init_std: f64,
}

impl Default for LmConfig {
    /// Every default, `vocab_size` 0 (to be set from the data): what a `[model]` section
    /// leaves out.
    fn default() -> Self {
        Self::new(0)
    }
}

impl LmConfig {
    /// Builds the model; call [`validate`](Self::validate) first on untrusted configs.
    pub fn init(&self, device: &Device) -> Lm {
        let normal = Initializer::Normal {
            mean: 0.0,
            std: self.init_std,
        };
        let (norm, layer_norm) = norm::pre_norm(self.norm, self.d_model, device);
        Lm {
            embedding: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(normal.clone())
                .init(device),
            positions: (self.positions == Positions::Learned).then(|| {
                EmbeddingConfig::new(self.max_seq_len, self.d_model)
                    .with_initializer(normal.clone())
                    .init(device)
            }),
            blocks: self
                .mixers()
                .into_iter()
                .map(|kind| Block::new(&self.for_mixer(kind), device))
                .collect(),
            norm,
            layer_norm,
            head: (!self.tie_embeddings).then(|| {
                LinearConfig::new(self.d_model, self.vocab_size)
                    .with_bias(false)
                    .with_initializer(normal)
                    .init(device)
            }),
            dropout: DropoutConfig::new(self.dropout).init(),
            form: Form::passes(self.chunk_size, self.segment_size),
        }
    }

    /// Each layer's mixer, first layer first: `layers`, else `mixer` in every layer.
    pub fn mixers(&self) -> Vec<MixerKind> {
        self.layers
            .clone()
            .unwrap_or_else(|| vec![self.mixer; self.n_layers])
    }

    /// Whether some layer's mixer is `kind`.
    pub fn has(&self, kind: MixerKind) -> bool {
        self.mixers().contains(&kind)
    }

    /// Whether the layers' mixers differ.
    pub fn is_hybrid(&self) -> bool {
        self.mixers().windows(2).any(|w| w[0] != w[1])
    }

    /// The stack's mixers in words: the mixer of a uniform stack (`hla2`), runs of layers
    /// of a hybrid joined by `+` (`hla2×3+softmax`).
    pub fn mixer_label(&self) -> String {
        let mixers = self.mixers();
        if !self.is_hybrid() {
            return mixers.first().unwrap_or(&self.mixer).name().into();
        }
        let mut runs: Vec<(MixerKind, usize)> = Vec::new();
        for kind in mixers {
            match runs.last_mut() {
                Some((last, n)) if *last == kind => *n += 1,
                _ => runs.push((kind, 1)),
            }
        }
        let run = |(kind, n): &(MixerKind, usize)| match n {
            1 => kind.name().to_string(),
            n => format!("{}×{n}", kind.name()),
        };
        runs.iter().map(run).collect::<Vec<_>>().join("+")
    }

    /// The configuration of one layer with mixer `kind`: this one with `mixer` set and no
    /// `layers`, so that the mixer-dependent defaults resolve for that layer.
    pub fn for_mixer(&self, kind: MixerKind) -> LmConfig {
        let mut config = self.clone();
        config.mixer = kind;
        config.layers = None;
        config
    }

    /// The MLP's hidden width.
    pub fn d_ff(&self) -> usize {
        match (self.d_ff, self.mlp_kind) {
            (0, MlpKind::Swiglu) => (8 * self.d_model).div_ceil(3).div_ceil(16) * 16,
            (0, MlpKind::Gelu) => 4 * self.d_model,
            (d_ff, _) => d_ff,
        }
    }

    /// Whether `mixer`'s default output (of a hybrid's layer: call it on
    /// [`for_mixer`](Self::for_mixer)) is the ratio normalisation: the masked
    /// denominator with elu + 1 features and no output RMSNorm, for every linear-time
    /// mixer. On tiny-shakespeare it trains all four better than L2 (or elu + 1) features
    /// with the output norm, by 0.03–0.07 nats over three seeds
    /// (experiments/shakespeare-char-full); on associative recall it does not, so the
    /// MQAR configs keep the output norm (experiments/mqar-zoology).
    pub fn ratio_by_default(&self) -> bool {
        self.mixer != MixerKind::Softmax
    }

    /// Divide by the masked denominator: `normalize`, else the mixer's default.
    pub fn resolved_normalize(&self) -> bool {
        self.normalize.unwrap_or(self.ratio_by_default())
    }

    /// The per-head output RMSNorm: `output_norm`, else on without the denominator.
    pub fn resolved_output_norm(&self) -> bool {
        self.output_norm.unwrap_or(!self.resolved_normalize())
    }

    /// The feature map of HLA and linear attention: `feature_map`, else the mixer's
    /// default (elu + 1 for linear attention and with the masked denominator, L2 for HLA
    /// otherwise).
    pub fn resolved_feature_map(&self) -> FeatureMap {
        self.feature_map.unwrap_or(
            if self.mixer == MixerKind::Linear || self.resolved_normalize() {
                FeatureMap::EluPlusOne
            } else {
                FeatureMap::L2
            },
        )
    }

    /// The longest sequence the model can run (`None`: any), a limit of RoPE's table and
    /// of learned positions.
    pub fn position_limit(&self) -> Option<usize> {
        (self.has(MixerKind::Softmax) || self.positions == Positions::Learned)
            .then_some(self.max_seq_len)
    }

    /// Initial std of the projections that write into the residual stream, scaled by
    /// 1/√(2·n_layers) (GPT-2, nanoGPT).
    pub fn residual_std(&self) -> f64 {
        self.init_std / (2.0 * self.n_layers as f64).sqrt()
    }
}
