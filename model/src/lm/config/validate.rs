//! Which configurations can build a model, and the error that names the key of one that
//! cannot.

use super::{LmConfig, MixerKind};

/// A configuration that cannot build a model.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{key} must be {requirement}, got {value}")]
    Invalid {
        key: &'static str,
        requirement: &'static str,
        value: String,
    },
}

impl LmConfig {
    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |key, requirement, value: &dyn std::fmt::Display| {
            Err(ConfigError::Invalid {
                key,
                requirement,
                value: value.to_string(),
            })
        };
        if self.vocab_size == 0 {
            return fail("vocab_size", "at least 1", &self.vocab_size);
        }
        if self.d_model == 0 {
            return fail("d_model", "at least 1", &self.d_model);
        }
        if self.n_layers == 0 {
            return fail("n_layers", "at least 1", &self.n_layers);
        }
        if let Some(layers) = &self.layers {
            if layers.len() != self.n_layers {
                let value = format!("{} names for n_layers = {}", layers.len(), self.n_layers);
                return fail(
                    "layers",
                    "one mixer name per layer (n_layers of them)",
                    &value,
                );
            }
            if self.mixer != Self::default().mixer {
                return fail(
                    "mixer",
                    "left out when layers gives each layer's mixer",
                    &self.mixer.name(),
                );
            }
        }
        if self.n_heads == 0 || !self.d_model.is_multiple_of(self.n_heads) {
            return fail("n_heads", "a divisor of d_model", &self.n_heads);
        }
        if self.has(MixerKind::Softmax) && !(self.d_model / self.n_heads).is_multiple_of(2) {
            return fail(
                "n_heads",
                "such that the head dimension is even (RoPE)",
                &self.n_heads,
            );
        }
        if !(self.decay_base.is_finite() && self.decay_base > 0.0) {
            return fail("decay_base", "positive and finite", &self.decay_base);
        }
        if self.short_conv == 1 {
            return fail(
                "short_conv",
                "0 (off) or a kernel of at least 2",
                &self.short_conv,
            );
        }
        if self.chunk_size == 0 {
            return fail("chunk_size", "at least 1", &self.chunk_size);
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return fail("dropout", "in [0, 1)", &self.dropout);
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return fail("init_std", "positive and finite", &self.init_std);
        }
        if self.max_seq_len == 0 {
            return fail("max_seq_len", "at least 1", &self.max_seq_len);
        }
        Ok(())
    }
}
