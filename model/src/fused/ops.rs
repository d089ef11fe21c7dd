//! The fused ops as a Burn backend extension: the CPU backends run each op's kernel, and
//! their autodiff wrapper records it as one node whose backward pass is the op's backward
//! kernel.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, backend_extension};

use super::Host;
use super::autodiff::{record, record_tracked};
use crate::hla::fused::{self as hla_fused, Kernel};
use crate::lm::mixer::tokens::{self, Tokens};
use crate::lm::{attention, conv, head, linear, mlp, norm};
use crate::optim::fused::{self as adamw, Step};

/// Ops with a fused kernel. Shapes are the callers' (see each op's module); every tensor
/// is f32 and contiguous or made so.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait FusedOps: Backend {
    /// `silu(a) ⊙ b` of `x = [a | b]`, [`mlp::swiglu`].
    fn swiglu(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// RMSNorm over the last dimension with gain `gamma`, [`norm::rms_norm`].
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self>;

    /// The short causal convolution and its SiLU over `history` (empty: zeros) then `x`,
    /// [`conv::convolve`].
    fn short_conv(
        x: FloatTensor<Self>,
        history: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `x W` for `x [rows, d_in]`, or `x Wᵀ` when `transposed`, [`linear::project`].
    fn project(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;

    /// The mean cross-entropy of the logits `x W` (`x Wᵀ` when `transposed`) of `x [n, d]`
    /// against `targets [n]` (token ids as floats) and the count of hits, `[loss, hits]`
    /// ([`head::head_loss`]).
    fn head_loss(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;

    /// Each row's negative log-likelihood and hit (1 or 0), `[n, 2]`, of the same logits
    /// ([`head::scores`]; no gradient flows through it).
    fn head_scores(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;

    /// Causal softmax attention of queries from position `start`,
    /// [`attention::causal_attention`].
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self>;

    /// HLA of `kernel.order` in chunks of `kernel.chunk` from the state packed per head:
    /// the packed output and final state ([`crate::hla::fused`]).
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
    ) -> FloatTensor<Self>;

    /// The recurrent mixer from `qkv [batch, time, 3·d]`: the packed output and final
    /// state ([`tokens`]).
    fn hla_tokens(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        tokens: Tokens,
    ) -> FloatTensor<Self>;

    /// The recurrent mixer by the serial recurrence, the state updated in place: the packed
    /// `[state | o]` ([`tokens::serial`]; no gradient flows through it).
    fn hla_serial(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        packed: FloatTensor<Self>,
        tokens: Tokens,
    ) -> FloatTensor<Self>;

    /// The softmax mixer from `qkv [batch, time, 3·d]` and the RoPE table of its positions
    /// ([`tokens::attention`]).
    fn attention_tokens(
        qkv: FloatTensor<Self>,
        rope: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self>;

    /// One AdamW step of a parameter `p` with gradient `g` and moments `m`, `v`: the new
    /// `(p, m, v)` ([`crate::optim::AdamW`]; no gradient flows through it).
    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: Step,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl<B: Host> FusedOps for B {
    fn swiglu(x: FloatTensor<B>) -> FloatTensor<B> {
        mlp::fused::forward::<B>([x]).0
    }

    fn rms_norm(x: FloatTensor<B>, gamma: FloatTensor<B>, epsilon: f64) -> FloatTensor<B> {
        norm::fused::forward::<B>([x, gamma], epsilon).0
    }

    fn short_conv(
        x: FloatTensor<B>,
        history: FloatTensor<B>,
        weight: FloatTensor<B>,
    ) -> FloatTensor<B> {
        conv::fused::forward::<B>([x, history, weight]).0
    }

    fn project(x: FloatTensor<B>, weight: FloatTensor<B>, transposed: bool) -> FloatTensor<B> {
        if transposed {
            linear::fused::forward::<B, true>([x, weight]).0
        } else {
            linear::fused::forward::<B, false>([x, weight]).0
        }
    }

    fn head_loss(
        x: FloatTensor<B>,
        weight: FloatTensor<B>,
        targets: FloatTensor<B>,
        transposed: bool,
    ) -> FloatTensor<B> {
        head::fused::forward::<B>([x, weight, targets], transposed, false).0
    }

    fn head_scores(
        x: FloatTensor<B>,
        weight: FloatTensor<B>,
        targets: FloatTensor<B>,
        transposed: bool,
    ) -> FloatTensor<B> {
        head::fused::scores::<B>([x, weight, targets], transposed)
    }

    fn attention(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        start: usize,
    ) -> FloatTensor<B> {
        attention::fused::forward::<B>([q, k, v], start).0
    }

    fn hla_chunked(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        log_g: FloatTensor<B>,
        state: FloatTensor<B>,
        kernel: Kernel,
    ) -> FloatTensor<B> {
        hla_fused::forward::<B>([q, k, v, log_g, state], kernel).0
    }

    fn hla_tokens(
        qkv: FloatTensor<B>,
        log_g: FloatTensor<B>,
        state: FloatTensor<B>,
        t: Tokens,
    ) -> FloatTensor<B> {
        tokens::recurrent::kernel_forward::<B>([qkv, log_g, state], t).0
    }

    fn hla_serial(
        qkv: FloatTensor<B>,
        log_g: FloatTensor<B>,
        packed: FloatTensor<B>,
        t: Tokens,
    ) -> FloatTensor<B> {
        tokens::serial::kernel::<B>([qkv, log_g, packed], t)
    }

    fn attention_tokens(qkv: FloatTensor<B>, rope: FloatTensor<B>, heads: usize) -> FloatTensor<B> {
        tokens::attention::kernel_forward::<B>([qkv, rope], heads).0
    }

    fn adamw(
        p: FloatTensor<B>,
        g: FloatTensor<B>,
        m: FloatTensor<B>,
        v: FloatTensor<B>,
        step: Step,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        adamw::step::<B>([p, g, m, v], step)
    }
}

impl<B: Host, C: CheckpointStrategy> FusedOps for Autodiff<B, C> {
    fn swiglu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<B, C, 1>([x], mlp::fused::forward::<B>, mlp::fused::backward::<B>)
    }

    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self> {
        record::<B, C, 2>(
            [x, gamma],
            |inputs| norm::fused::forward::<B>(inputs, epsilon),
            norm::fused::backward::<B>,
        )
    }

    fn short_conv(
        x: FloatTensor<Self>,
        history: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        record::<B, C, 3>(
            [x, history, weight],
            conv::fused::forward::<B>,
            conv::fused::backward::<B>,
        )
    }

    fn project(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        use linear::fused::{backward, forward};
        if transposed {
            record::<B, C, 2>([x, weight], forward::<B, true>, backward::<B, true>)
        } else {
            record::<B, C, 2>([x, weight], forward::<B, false>, backward::<B, false>)
        }
    }

    fn head_loss(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        record_tracked::<B, C, 3>(
            [x, weight, targets],
            |inputs, grad| head::fused::forward::<B>(inputs, transposed, grad),
            head::fused::backward::<B>,
        )
    }

    fn head_scores(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        let inner = [x, weight, targets].map(|t| t.into_primitive());
        <FloatTensor<Self>>::new(head::fused::scores::<B>(inner, transposed))
    }

    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        use attention::fused::{backward, forward};
        record::<B, C, 3>(
            [q, k, v],
            |inputs| forward::<B>(inputs, start),
            move |saved, grad| backward::<B>(saved, grad, start),
        )
    }

    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        record::<B, C, 5>(
            [q, k, v, log_g, state],
            |inputs| hla_fused::forward::<B>(inputs, kernel),
            move |saved, grad| hla_fused::backward::<B>(saved, grad, kernel),
        )
    }

    fn hla_tokens(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        t: Tokens,
    ) -> FloatTensor<Self> {
        use tokens::recurrent::{kernel_backward, kernel_forward};
        record::<B, C, 3>(
            [qkv, log_g, state],
            |inputs| kernel_forward::<B>(inputs, t),
            move |saved, grad| kernel_backward::<B>(saved, grad, t),
        )
    }

    fn hla_serial(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        packed: FloatTensor<Self>,
        t: Tokens,
    ) -> FloatTensor<Self> {
        let inner = [qkv, log_g, packed].map(|t| t.into_primitive());
        <FloatTensor<Self>>::new(tokens::serial::kernel::<B>(inner, t))
    }

    fn attention_tokens(
        qkv: FloatTensor<Self>,
        rope: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        use tokens::attention::{kernel_backward, kernel_forward};
        record::<B, C, 2>(
            [qkv, rope],
            |inputs| kernel_forward::<B>(inputs, heads),
            move |saved, grad| kernel_backward::<B>(saved, grad, heads),
        )
    }

    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: Step,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Optimizers step the inner tensors; autodiff ones take the same kernel, untracked.
        let inner = [p, g, m, v].map(|t| t.into_primitive());
        let (p, m, v) = adamw::step::<B>(inner, step);
        let wrap = <FloatTensor<Self>>::new;
        (wrap(p), wrap(m), wrap(v))
    }
}
