//! The output head and its loss: the final norm, the projection to the vocabulary (the
//! embedding table, tied, or a weight of its own) and the cross-entropy of the targets.
//!
//! On CPU devices the projection, log-softmax, loss, accuracy and the gradients of the rows
//! and the head weight run as one pass over blocks of rows ([`cpu`], the technique
//! of Liger Kernel's fused linear cross-entropy): no `[rows, vocab]` tensor lives across
//! forward and backward, which at a GPT-2 vocabulary is most of a step's memory. The
//! composed form ([`head_loss_composed`], [`scores_composed`]) is its test oracle and
//! serves every other device.

#[cfg(cpu_kernels)]
pub(crate) mod cpu;

use burn::prelude::*;
use burn::tensor::activation::log_softmax;

use super::{Lm, linear, norm};

/// Negative log-likelihood of each target: `logits [batch, time, vocab]`, `targets
/// [batch, time]` → `[batch, time]` (nats).
pub fn token_nll(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<2> {
    let log_p = log_softmax(logits, 2);
    -log_p.gather(2, targets.unsqueeze_dim(2)).squeeze_dim(2)
}

/// The cross-entropy of some rows' targets and how many the head predicts.
#[derive(Debug, Clone)]
pub struct HeadLoss {
    /// `[1]`: the mean negative log-likelihood over the rows (nats).
    pub loss: Tensor<1>,
    /// `[1]`: how many rows have their target as the top logit (no gradient).
    pub hits: Tensor<1>,
    /// Rows scored.
    pub rows: usize,
}

/// Per-row scores of [`Lm::scores`], no gradient.
#[derive(Debug, Clone)]
pub struct TokenScores {
    /// `[rows]`: each target's negative log-likelihood (nats).
    pub nll: Tensor<1>,
    /// `[rows]`: whether the target is the row's top logit.
    pub hits: Tensor<1, Bool>,
}

impl Lm {
    /// `x [.., d_model]` (the blocks' output) → logits `[.., vocab]`: the final norm and
    /// the head.
    pub(crate) fn logits<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let (weight, transposed) = self.head_weight();
        let x = norm::either(&self.norm, &self.layer_norm, x);
        if transposed {
            linear::project_transposed(x, weight)
        } else {
            linear::project(x, weight)
        }
    }

    /// Mean cross-entropy of `rows [n, d_model]` (from [`Lm::rows`]) against `targets
    /// [n]`, with the count of rows the head predicts right: the final norm, the head and
    /// the loss, a CPU kernel on CPU devices.
    pub fn head_loss(&self, rows: Tensor<2>, targets: Tensor<1, Int>) -> HeadLoss {
        let (weight, transposed) = self.head_weight();
        head_loss(self.final_norm(rows), weight, transposed, targets)
    }

    /// Each target's negative log-likelihood and hit for `rows [n, d_model]` against
    /// `targets [n]`, without gradients and without keeping the `[n, vocab]` logits on
    /// CPU devices: what evaluation needs.
    pub fn scores(&self, rows: Tensor<2>, targets: Tensor<1, Int>) -> TokenScores {
        let (weight, transposed) = self.head_weight();
        scores(self.final_norm(rows), weight, transposed, targets)
    }

    fn final_norm(&self, rows: Tensor<2>) -> Tensor<2> {
        norm::either(&self.norm, &self.layer_norm, rows)
    }

    /// The head's weight (bias-free) and whether it is stored `[vocab, d_model]` (the tied
    /// embedding table) rather than `[d_model, vocab]` (Burn's `Linear`).
    fn head_weight(&self) -> (Tensor<2>, bool) {
        match &self.head {
            Some(head) => (head.weight.val(), false),
            None => (self.embedding.weight.val(), true),
        }
    }
}

/// Mean cross-entropy of the logits `x W` (`x Wᵀ` when `transposed`) of `x [n, d]`
/// against `targets [n]`, and the count of hits; a CPU kernel on CPU devices.
pub fn head_loss(
    x: Tensor<2>,
    weight: Tensor<2>,
    transposed: bool,
    targets: Tensor<1, Int>,
) -> HeadLoss {
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&x) {
        use cpu::HeadCpuOps;
        let rows = x.dims()[0];
        let out = <burn::backend::Dispatch as HeadCpuOps>::head_loss(
            x.into_dispatch(),
            weight.into_dispatch(),
            targets.float().into_dispatch(),
            transposed,
        );
        let out = Tensor::<1>::from_dispatch(out);
        return HeadLoss {
            loss: out.clone().narrow(0, 0, 1),
            hits: out.narrow(0, 1, 1).detach(),
            rows,
        };
    }
    head_loss_composed(x, weight, transposed, targets)
}

/// The composed form of [`head_loss`], its test oracle.
pub fn head_loss_composed(
    x: Tensor<2>,
    weight: Tensor<2>,
    transposed: bool,
    targets: Tensor<1, Int>,
) -> HeadLoss {
    let rows = x.dims()[0];
    let (nll, hits) = composed(linear::project_composed(x, weight, transposed), targets);
    HeadLoss {
        loss: nll.mean(),
        hits: hits.float().sum(),
        rows,
    }
}

/// Each row's negative log-likelihood and hit for `logits [rows, vocab]` and `targets
/// [rows]`, composed.
fn composed(logits: Tensor<2>, targets: Tensor<1, Int>) -> (Tensor<1>, Tensor<1, Bool>) {
    let top = logits.clone().detach().argmax(1).squeeze_dim::<1>(1);
    let hits = top.equal(targets.clone());
    let log_p = log_softmax(logits, 1);
    let nll = -log_p
        .gather(1, targets.unsqueeze_dim(1))
        .squeeze_dim::<1>(1);
    (nll, hits)
}

/// Each target's negative log-likelihood and hit for the logits `x W` (`x Wᵀ` when
/// `transposed`) of `x [n, d]`; a CPU kernel on CPU devices, no gradient.
pub fn scores(
    x: Tensor<2>,
    weight: Tensor<2>,
    transposed: bool,
    targets: Tensor<1, Int>,
) -> TokenScores {
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&x) {
        use cpu::HeadCpuOps;
        let out = <burn::backend::Dispatch as HeadCpuOps>::head_scores(
            x.detach().into_dispatch(),
            weight.detach().into_dispatch(),
            targets.float().into_dispatch(),
            transposed,
        );
        let out = Tensor::<2>::from_dispatch(out);
        let rows = out.dims()[0];
        return TokenScores {
            nll: out.clone().narrow(1, 0, 1).reshape([rows]),
            hits: out.narrow(1, 1, 1).reshape([rows]).greater_elem(0.5),
        };
    }
    scores_composed(x, weight, transposed, targets)
}

/// The composed form of [`scores`], its test oracle.
pub fn scores_composed(
    x: Tensor<2>,
    weight: Tensor<2>,
    transposed: bool,
    targets: Tensor<1, Int>,
) -> TokenScores {
    let logits = linear::project_composed(x.detach(), weight.detach(), transposed);
    let (nll, hits) = composed(logits, targets);
    TokenScores { nll, hits }
}
