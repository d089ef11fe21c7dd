//! Decay factors over a span of tokens (one chunk, or the whole sequence for the
//! reference forms), spec §6.
//!
//! With gates `g_s` and `b_τ = Σ_{s≤τ} log g_s` counted from the span's start:
//! `a_τ = exp(b_τ)` (decay from the start to τ), `e_τ = exp(b_last − b_τ)` (from τ to the
//! end), `ρ = a_last`, and the mask `D_{τσ} = exp(b_τ − b_σ)` for σ ≤ τ, else 0. Every
//! exponent is a difference that is ≤ 0, so nothing overflows. Without gates all factors
//! are 1 and `D` is the causal mask `L`.

use burn::prelude::*;

pub(crate) struct Decay {
    /// `b`, `[batch or 1, heads or 1, span, 1]`; `None` without gates.
    b: Option<Tensor<4>>,
}

impl Decay {
    pub(crate) fn over(log_g: Option<&Tensor<3>>) -> Self {
        Self {
            b: log_g.map(|g| g.clone().cumsum(2).unsqueeze_dim(3)),
        }
    }

    /// `diag(a^p) x` for `x [.., span, n]`.
    pub(crate) fn since_start(&self, x: Tensor<4>, p: f64) -> Tensor<4> {
        match &self.b {
            None => x,
            Some(b) => x * (b.clone() * p).exp(),
        }
    }

    /// `diag(e^p) x` for `x [.., span, n]`.
    pub(crate) fn until_end(&self, x: Tensor<4>, p: f64) -> Tensor<4> {
        match &self.b {
            None => x,
            Some(b) => {
                let last = b.dims()[2] - 1;
                let b_last = b.clone().slice(s![.., .., last..=last, ..]);
                x * ((b_last - b.clone()) * p).exp()
            }
        }
    }

    /// `ρ^p x` for a state `x [.., rows, cols]`.
    pub(crate) fn whole(&self, x: Tensor<4>, p: f64) -> Tensor<4> {
        match &self.b {
            None => x,
            Some(b) => {
                let last = b.dims()[2] - 1;
                x * (b.clone().slice(s![.., .., last..=last, ..]) * p).exp()
            }
        }
    }

    /// `x ⊙ D^p` for `x [.., span, span]`.
    pub(crate) fn mask(&self, x: Tensor<4>, p: f64) -> Tensor<4> {
        match &self.b {
            None => x.tril(0),
            Some(b) => {
                let diff = b.clone() - b.clone().swap_dims(2, 3);
                // Zero the upper triangle before exp so its positive exponents never overflow.
                x * (diff * p).tril(0).exp().tril(0)
            }
        }
    }
}
