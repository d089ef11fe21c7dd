//! The optional masked denominator (docs/math.md §3 eq 3.4, §9).

use burn::prelude::*;

use super::HlaInput;

/// Whether outputs are divided by the masked denominator.
#[derive(Config, Debug, Copy, PartialEq)]
pub enum Output {
    /// `o_t = num_t` (the paper's default).
    Raw,
    /// `o_t = num_t / clamp(den_t)` with the sign-preserving clamp at `eps`.
    Normalized { eps: f64 },
}

impl Output {
    /// Appends a value column of ones: the operator then computes the denominator (the
    /// same sum with `v_j = 1`) as its last output column, with its state alongside.
    pub(crate) fn augment(&self, input: HlaInput) -> HlaInput {
        match self {
            Self::Raw => input,
            Self::Normalized { .. } => {
                let [b, h, t, _] = input.v.dims();
                let ones = Tensor::ones([b, h, t, 1], &input.v.device());
                HlaInput {
                    v: Tensor::cat(vec![input.v, ones], 3),
                    ..input
                }
            }
        }
    }

    /// Splits off the denominator column and divides by it.
    pub(crate) fn finish(&self, o: Tensor<4>) -> Tensor<4> {
        match self {
            Self::Raw => o,
            Self::Normalized { eps } => {
                let dv = o.dims()[3] - 1;
                let den = o.clone().slice(s![.., .., .., dv..]);
                o.slice(s![.., .., .., ..dv]) / sign_preserving_clamp(den, *eps)
            }
        }
    }
}

/// `sign(x) · max(|x|, eps)`, with sign(0) = +1: the masked denominator has no fixed sign
/// (docs/math.md §9), so a plain `max(x, eps)` would flip negative ones.
pub fn sign_preserving_clamp<const D: usize>(x: Tensor<D>, eps: f64) -> Tensor<D> {
    let negative = x.clone().lower_elem(0.0);
    let magnitude = x.abs().clamp_min(eps);
    magnitude.clone().mask_where(negative, -magnitude)
}
