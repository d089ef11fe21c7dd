//! The train section's workloads: nanoGPT's CPU configuration, a long context, GPT-2's
//! recipe at two sizes and the Gutenberg study's model with its hybrids.

use hla_model::lm::{LmConfig, MixerKind, MlpKind, NormKind, Positions};

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
    pub(super) fn models(&self, mixers: &[MixerKind]) -> Vec<LmConfig> {
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
pub(super) const CHARS: usize = 65;
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

#[cfg(test)]
mod tests {
    use burn::prelude::*;

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
