//! `[model]`: the language model's section of a run config.

use hla_model::lm::{DecayKind, FeatureMap, LmConfig, MixerKind, MlpKind, NormKind, Positions};
use serde::{Deserialize, Serialize};

use super::{by_name, by_name_opt};

/// `[model]`: the language model (see `hla_model::lm::LmConfig`); the vocabulary size
/// comes from the data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    #[serde(with = "by_name")]
    pub mixer: MixerKind,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    #[serde(with = "by_name_opt", skip_serializing_if = "Option::is_none")]
    pub feature_map: Option<FeatureMap>,
    #[serde(with = "by_name")]
    pub decay: DecayKind,
    pub decay_base: f64,
    pub short_conv: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_norm: Option<bool>,
    pub output_gate: bool,
    pub shared_keys: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
    pub chunk_size: usize,
    pub segment_size: usize,
    pub mlp: bool,
    #[serde(with = "by_name")]
    pub mlp_kind: MlpKind,
    pub d_ff: usize,
    #[serde(with = "by_name")]
    pub norm: NormKind,
    #[serde(with = "by_name")]
    pub positions: Positions,
    pub dropout: f64,
    pub tie_embeddings: bool,
    pub max_seq_len: usize,
    pub init_std: f64,
}

impl Default for ModelSection {
    fn default() -> Self {
        let c = LmConfig::new(0);
        Self {
            mixer: c.mixer,
            d_model: c.d_model,
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            feature_map: c.feature_map,
            decay: c.decay,
            decay_base: c.decay_base,
            short_conv: c.short_conv,
            output_norm: c.output_norm,
            output_gate: c.output_gate,
            shared_keys: c.shared_keys,
            normalize: c.normalize,
            chunk_size: c.chunk_size,
            segment_size: c.segment_size,
            mlp: c.mlp,
            mlp_kind: c.mlp_kind,
            d_ff: c.d_ff,
            norm: c.norm,
            positions: c.positions,
            dropout: c.dropout,
            tie_embeddings: c.tie_embeddings,
            max_seq_len: c.max_seq_len,
            init_std: c.init_std,
        }
    }
}

impl ModelSection {
    /// Writes out the mixer's defaults of the keys whose default depends on the mixer
    /// (`feature_map`, `normalize`, `output_norm`), so that a recorded run says what it
    /// trained whatever later defaults become; softmax attention uses none of them and
    /// keeps its feature map unset.
    pub fn resolve_defaults(&mut self) {
        let c = self.lm_config(1);
        self.normalize = Some(c.resolved_normalize());
        self.output_norm = Some(c.resolved_output_norm());
        if self.mixer != MixerKind::Softmax {
            self.feature_map = Some(c.resolved_feature_map());
        }
    }

    pub fn lm_config(&self, vocab_size: usize) -> LmConfig {
        LmConfig {
            vocab_size,
            mixer: self.mixer,
            d_model: self.d_model,
            n_layers: self.n_layers,
            n_heads: self.n_heads,
            feature_map: self.feature_map,
            decay: self.decay,
            decay_base: self.decay_base,
            short_conv: self.short_conv,
            output_norm: self.output_norm,
            output_gate: self.output_gate,
            shared_keys: self.shared_keys,
            normalize: self.normalize,
            chunk_size: self.chunk_size,
            segment_size: self.segment_size,
            mlp: self.mlp,
            mlp_kind: self.mlp_kind,
            d_ff: self.d_ff,
            norm: self.norm,
            positions: self.positions,
            dropout: self.dropout,
            tie_embeddings: self.tie_embeddings,
            max_seq_len: self.max_seq_len,
            init_std: self.init_std,
        }
    }
}
