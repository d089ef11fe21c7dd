//! Decay factors over spans of tokens (one chunk, every chunk at once, or the whole
//! sequence for the reference forms), docs/math.md §6.
//!
//! With gates `g_s` and `b_τ = Σ_{s≤τ} log g_s` counted from the span's start:
//! `a_τ = exp(b_τ)` (decay from the start to τ), `e_τ = exp(b_last − b_τ)` (from τ to the
//! end), `ρ = a_last`, and the mask `D_{τσ} = exp(b_τ − b_σ)` for σ ≤ τ, else 0. Every
//! exponent is a difference that is ≤ 0, so nothing overflows. Without gates all factors
//! are 1 and `D` is the causal mask `L`.
//!
//! The span is dimension `D − 2` of every tensor, so the same code serves `[batch, heads,
//! span, n]` and the chunked layout `[batch, heads, chunks, span, n]`.

use std::cell::OnceCell;

use burn::prelude::*;

pub(crate) struct Decay<const D: usize> {
    gates: Option<Gates<D>>,
}

struct Gates<const D: usize> {
    /// `b`, `[.., span, 1]`.
    b: Tensor<D>,
    /// `D`, `[.., span, span]`, built on first use and shared by every power.
    mask: OnceCell<Tensor<D>>,
}

impl Decay<4> {
    /// Over the whole span of `log_g [batch or 1, heads or 1, span]`.
    pub(crate) fn over(log_g: Option<&Tensor<3>>) -> Self {
        Self::from_log_gates(log_g.map(|g| g.clone().unsqueeze_dim(3)))
    }
}

impl<const D: usize> Decay<D> {
    /// From log gates `[.., span, 1]`; `None` without gates.
    pub(crate) fn from_log_gates(log_g: Option<Tensor<D>>) -> Self {
        Self::from_cumulative_or_none(log_g.map(|g| g.cumsum(D - 2)))
    }

    /// From the cumulative log gates `b [.., span, 1]`; `None` without gates.
    pub(crate) fn from_cumulative_or_none(b: Option<Tensor<D>>) -> Self {
        match b {
            Some(b) => Self::from_cumulative(b),
            None => Self { gates: None },
        }
    }

    /// From the cumulative log gates `b [.., span, 1]`.
    pub(crate) fn from_cumulative(b: Tensor<D>) -> Self {
        Self {
            gates: Some(Gates {
                b,
                mask: OnceCell::new(),
            }),
        }
    }

    /// `diag(a^p) x` for `x [.., span, n]`.
    pub(crate) fn since_start(&self, x: Tensor<D>, p: f64) -> Tensor<D> {
        match &self.gates {
            None => x,
            Some(g) => x * (g.b.clone() * p).exp(),
        }
    }

    /// `diag(e^p) x` for `x [.., span, n]`.
    pub(crate) fn until_end(&self, x: Tensor<D>, p: f64) -> Tensor<D> {
        match &self.gates {
            None => x,
            Some(g) => x * ((g.last() - g.b.clone()) * p).exp(),
        }
    }

    /// `ρ^p x` for a state `x [.., rows, cols]`.
    pub(crate) fn whole(&self, x: Tensor<D>, p: f64) -> Tensor<D> {
        match self.log_rho(p) {
            None => x,
            Some(log_rho) => x * log_rho.exp(),
        }
    }

    /// The cumulative log gates `b`, `[.., span, 1]`; `None` without gates.
    #[cfg(any(cpu_kernels, gpu_kernels))]
    pub(crate) fn log_decay(&self) -> Option<Tensor<D>> {
        self.gates.as_ref().map(|g| g.b.clone())
    }

    /// `log ρ^p`, `[.., 1, 1]`; `None` without gates.
    pub(crate) fn log_rho(&self, p: f64) -> Option<Tensor<D>> {
        self.gates.as_ref().map(|g| g.last() * p)
    }

    /// `x ⊙ D^p` for `x [.., span, span]`.
    pub(crate) fn mask(&self, x: Tensor<D>, p: u32) -> Tensor<D> {
        match &self.gates {
            None => x.tril(0),
            Some(g) => {
                let d = g.mask();
                (1..p).fold(x * d.clone(), |acc, _| acc * d.clone())
            }
        }
    }
}

impl<const D: usize> Gates<D> {
    /// `b_last`, `[.., 1, 1]`.
    fn last(&self) -> Tensor<D> {
        let span = self.b.dims()[D - 2];
        self.b.clone().narrow(D - 2, span - 1, 1)
    }

    fn mask(&self) -> Tensor<D> {
        self.mask.get_or_init(|| mask_from(self.b.clone())).clone()
    }
}

/// `D_{τσ} = exp(b_τ − b_σ)` for σ ≤ τ, else 0, from the cumulative log gates
/// `b [.., span, 1]`.
pub(crate) fn mask_from<const D: usize>(b: Tensor<D>) -> Tensor<D> {
    decay_between(b.clone(), b, 0)
}

/// `exp(to_τ − from_σ)` for `σ ≤ τ + diagonal`, else 0, from `to, from [.., span, 1]`.
pub(crate) fn decay_between<const D: usize>(
    to: Tensor<D>,
    from: Tensor<D>,
    diagonal: i64,
) -> Tensor<D> {
    let diff = to - from.transpose();
    // Zero the upper triangle before exp so its positive exponents never overflow.
    diff.tril(diagonal).exp().tril(diagonal)
}

/// The gradient of the cumulative log gates `b [.., span, 1]`, gathered factor by factor
/// from `w = f ⊙ ∂f` (a factor times its gradient; every factor is `exp(p · (linear in
/// b))`, so `w` times that linear form's coefficients), and turned into the gradient of
/// the log gates, `∂ log g_s = Σ_{τ≥s} ∂b_τ`.
pub(crate) struct DecayGrad<const D: usize> {
    /// `∂b`, `[.., span, 1]`.
    db: Option<Tensor<D>>,
    /// The part of `∂b` at the span's last token, `[.., 1, 1]`.
    last: Option<Tensor<D>>,
    /// The log gates' gradient a fused kernel gathered (its `∂b` summed from each token to
    /// the span's end, the earlier kernels' added), `[.., span, 1]`.
    summed: Option<Tensor<D>>,
}

impl<const D: usize> DecayGrad<D> {
    pub(crate) fn new() -> Self {
        Self {
            db: None,
            last: None,
            summed: None,
        }
    }

    /// From `a^p_τ = exp(p b_τ)`, `w [.., span, 1]`.
    pub(crate) fn since_start(&mut self, p: f64, w: Tensor<D>) {
        add(&mut self.db, w * p);
    }

    /// From `e^p_τ = exp(p (b_last − b_τ))`, `w [.., span, 1]`.
    pub(crate) fn until_end(&mut self, p: f64, w: Tensor<D>) {
        add(&mut self.last, w.clone().sum_dim(D - 2) * p);
        add(&mut self.db, w * -p);
    }

    /// From `ρ^p = exp(p b_last)`, `w [.., 1, 1]`.
    pub(crate) fn whole(&mut self, p: f64, w: Tensor<D>) {
        add(&mut self.last, w * p);
    }

    /// From the mask `D^p_{τσ} = exp(p (b_τ − b_σ))`, `w = D^p ⊙ ∂D^p` `[.., span, span]`
    /// (zero above the diagonal).
    pub(crate) fn mask(&mut self, p: f64, w: Tensor<D>) {
        let rows = w.clone().sum_dim(D - 1);
        let cols = w.sum_dim(D - 2).transpose();
        add(&mut self.db, (rows - cols) * p);
    }

    /// The log gates' gradient a fused kernel gathered so far, which the next kernel adds
    /// its own to ([`DecayGrad::set_summed`]).
    #[cfg(gpu_kernels)]
    pub(crate) fn summed(&self) -> Option<&Tensor<D>> {
        self.summed.as_ref()
    }

    /// The log gates' gradient a fused kernel gathered, `[.., span, 1]`: its `∂b` summed
    /// from each token to the span's end, [`DecayGrad::summed`] added (so it replaces it).
    #[cfg(gpu_kernels)]
    pub(crate) fn set_summed(&mut self, summed: Tensor<D>) {
        self.summed = Some(summed);
    }

    /// The gradient of the log gates, `[.., span, 1]`.
    ///
    /// # Panics
    ///
    /// If no per-token factor (`a`, `e` or `D`) was gathered: every chunked form has one.
    pub(crate) fn into_log_gates(self) -> Tensor<D> {
        // Σ_{τ≥s} ∂b_τ, as the total less the sum before s.
        let from_end = self.db.map(|db| {
            let total = db.clone().sum_dim(D - 2);
            total - db.clone().cumsum(D - 2) + db
        });
        let per_token = match (from_end, self.summed) {
            (Some(from_end), Some(summed)) => from_end + summed,
            (from_end, summed) => from_end
                .or(summed)
                .expect("a per-token decay factor's gradient"),
        };
        // The last token's part reaches every token.
        match self.last {
            Some(last) => per_token + last,
            None => per_token,
        }
    }
}

fn add<const D: usize>(sum: &mut Option<Tensor<D>>, x: Tensor<D>) {
    *sum = Some(match sum.take() {
        Some(s) => s + x,
        None => x,
    });
}
