//! Workloads shared by the `hla bench` command and the criterion benches: the operators on
//! random inputs, their FLOP counts, and a language model decoding at a given position.
//! Timing is the caller's.

#[cfg(gpu_kernels)]
pub mod cost;

use burn::{prelude::*, tensor::Distribution};

use crate::hla::{self, Form, HlaInput, Order, Output, fixed_log_gates, multi_scale_decay};
use crate::lm::attention::causal_attention;
use crate::lm::{Lm, LmConfig, LmState, MixerKind};

/// The token mixers compared by the operator benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// Second-order HLA, chunk-parallel.
    Hla2Chunked,
    /// Third-order HLA, chunk-parallel.
    Hla3Chunked,
    /// Second-order HLA, the serial recurrence.
    Hla2Recurrent,
    /// First-order linear attention, chunk-parallel.
    LinearChunked,
    /// Asymmetric HLA (AHLA), chunk-parallel.
    AhlaChunked,
    /// Causal softmax attention (the softmax mixer's: CPU kernels on CPU devices).
    Softmax,
}

crate::config_names!(Operator {
    Hla2Chunked => "hla2-chunked",
    Hla3Chunked => "hla3-chunked",
    Hla2Recurrent => "hla2-recurrent",
    LinearChunked => "linear-chunked",
    AhlaChunked => "ahla-chunked",
    Softmax => "softmax",
});

impl Operator {
    pub const ALL: [Self; 6] = [
        Self::Hla2Chunked,
        Self::Hla3Chunked,
        Self::Hla2Recurrent,
        Self::LinearChunked,
        Self::AhlaChunked,
        Self::Softmax,
    ];

    /// Whether a CPU or GPU kernel computes this operator on `device` (every one on a CPU device;
    /// on a GPU device all but the serial recurrence).
    pub fn has_kernels(self, device: &Device) -> bool {
        crate::backend::on_cpu(device)
            || (crate::backend::on_gpu(device) && self != Self::Hla2Recurrent)
    }

    /// Whether this operator is a chunked form, which has a node (one autodiff node of
    /// Burn's ops, [`crate::backend::Kernels::Nodes`]).
    pub fn has_node(self) -> bool {
        self.chunked_order().is_some()
    }

    /// The order of the chunk-parallel operators.
    fn chunked_order(self) -> Option<Order> {
        match self {
            Self::Hla2Chunked => Some(Order::Second),
            Self::Hla3Chunked => Some(Order::Third),
            Self::LinearChunked => Some(Order::First),
            Self::AhlaChunked => Some(Order::Asymmetric),
            Self::Hla2Recurrent | Self::Softmax => None,
        }
    }

    /// Matmul FLOPs of one forward pass of the chunk-parallel forms, counted from the
    /// equations in their module docs (docs/math.md §5: no C³ term); `None` for the others.
    /// Elementwise work (decay masks, scans) is not counted.
    pub fn chunked_flops(self, shape: &Shape5) -> Option<f64> {
        let Shape5 {
            batch,
            heads,
            time,
            d,
            dv,
            chunk,
        } = *shape;
        let (c, d, dv) = (chunk as f64, d as f64, dv as f64);
        // 2·m·k·n per product, per chunk.
        let per_chunk = match self {
            // QKᵀ, (·)V; Q S, Kᵀ V.
            Self::LinearChunked => 2.0 * c * c * (d + dv) + 4.0 * c * d * dv,
            // QKᵀ, W K, Q Aᵀ, (·)V; Q Sᵀ, Kᵀ K; Q Z, Aᵀ V.
            Self::Hla2Chunked => 2.0 * c * c * (3.0 * d + dv) + 4.0 * c * d * (d + dv),
            // QKᵀ, W K, W V, Q Aᵀ, (·)B; Q Sᵀ, Kᵀ K; Q P, Kᵀ V, Q Y, Aᵀ B.
            Self::Hla3Chunked => 2.0 * c * c * (3.0 * d + 2.0 * dv) + 4.0 * c * d * (d + 2.0 * dv),
            // QKᵀ, A^γ V, A^γ B; Q P, Q E, Kᵀ V, Kᵀ B.
            Self::AhlaChunked => 2.0 * c * c * (d + 2.0 * dv) + 8.0 * c * d * dv,
            Self::Hla2Recurrent | Self::Softmax => return None,
        };
        let chunks = time.div_ceil(chunk) as f64;
        Some(per_chunk * chunks * (batch * heads) as f64)
    }
}

/// The operator benchmark's problem: `[batch, heads, time, d]` queries and keys, `dv`
/// value width, and the chunk size of the chunked forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape5 {
    pub batch: usize,
    pub heads: usize,
    pub time: usize,
    pub d: usize,
    pub dv: usize,
    pub chunk: usize,
}

/// The gates of an operator problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gating {
    /// The language model's default: the fixed multi-scale decay, which needs no gradient.
    #[default]
    Fixed,
    /// Data-dependent gates (the `gated` decay's), drawn in (0.9, 1): a leaf that needs a
    /// gradient on an autodiff device.
    Data,
}

crate::config_names!(Gating {
    Fixed => "fixed",
    Data => "data",
});

/// Random inputs of an operator problem, with the language model's default gates
/// (fixed multi-scale decay) or data-dependent ones ([`Gating`]); leaves that require
/// gradients when `device` is autodiff.
#[derive(Debug, Clone)]
pub struct OperatorInputs {
    pub q: Tensor<4>,
    pub k: Tensor<4>,
    pub v: Tensor<4>,
    pub log_g: Tensor<3>,
}

impl OperatorInputs {
    /// With the default gates.
    pub fn random(shape: &Shape5, device: &Device) -> Self {
        Self::gated(shape, Gating::Fixed, device)
    }

    /// With `gating`'s gates.
    pub fn gated(shape: &Shape5, gating: Gating, device: &Device) -> Self {
        let Shape5 {
            batch,
            heads,
            time,
            d,
            dv,
            ..
        } = *shape;
        // Unit-norm-ish rows, as after the L2 feature map: values stay O(1) at any length.
        let scale = 1.0 / (d as f64).sqrt();
        let uniform = |n: usize| {
            Tensor::<4>::random(
                [batch, heads, time, n],
                Distribution::Uniform(-1.0, 1.0),
                device,
            ) * scale
        };
        let grad = device.is_autodiff();
        let leaf = |t: Tensor<4>| if grad { t.require_grad() } else { t };
        let log_g = match gating {
            Gating::Fixed => fixed_log_gates(
                &multi_scale_decay(heads, hla::DEFAULT_DECAY_BASE),
                time,
                device,
            )
            .expect("the multi-scale decay lies in (0, 1)"),
            Gating::Data => {
                let g = Tensor::<3>::random(
                    [batch, heads, time],
                    Distribution::Uniform(0.9, 1.0),
                    device,
                );
                let log_g = g.log();
                if grad { log_g.require_grad() } else { log_g }
            }
        };
        Self {
            q: leaf(uniform(d)),
            k: leaf(uniform(d)),
            v: leaf(uniform(dv)),
            log_g,
        }
    }

    /// `op`'s output, `[batch, heads, time, dv]`; `chunked` is the form of the chunk-parallel
    /// operators ([`Form::Chunked`] or [`Form::Segmented`]).
    pub fn forward(&self, op: Operator, chunked: Form) -> Tensor<4> {
        let (order, form) = match (op, op.chunked_order()) {
            (Operator::Softmax, _) => return self.softmax(),
            (_, Some(order)) => (order, chunked),
            (_, None) => (Order::Second, Form::Recurrent),
        };
        let input = HlaInput::new(
            self.q.clone(),
            self.k.clone(),
            self.v.clone(),
            Some(self.log_g.clone()),
        )
        .expect("consistent shapes");
        hla::output(order, form, input, None, Output::Raw)
    }

    /// The forward pass, then the backward pass of the sum of the output (seeded with ones
    /// of the output's shape, the sum's gradient, without a sum to run); returns the query
    /// gradient, so the caller can wait for it.
    ///
    /// # Panics
    ///
    /// If the inputs were not made on an autodiff device.
    pub fn forward_backward(&self, op: Operator, chunked: Form) -> Tensor<4> {
        let grads = self.forward(op, chunked).backward();
        self.q
            .grad(&grads)
            .expect("inputs made on an autodiff device")
    }

    fn softmax(&self) -> Tensor<4> {
        causal_attention(self.q.clone(), self.k.clone(), self.v.clone(), 0)
    }
}

/// A language model for the decoding benchmark: the default width and depth with
/// `mixer`, a 256-token vocabulary, and room for `max_position` tokens.
pub fn decode_model(mixer: MixerKind, max_position: usize, device: &Device) -> Lm {
    LmConfig::new(256)
        .with_mixer(mixer)
        .with_max_seq_len(max_position)
        .init(device)
}

/// Feeds `position − state.position()` tokens through `prefill`, at most `piece` at a
/// time (the KV cache of softmax attention then grows piece by piece), so that the next
/// `step` decodes at `position`.
pub fn advance(lm: &Lm, state: &mut LmState, position: usize, piece: usize, device: &Device) {
    while state.position() < position {
        let n = piece.min(position - state.position());
        let tokens = Tensor::<2, Int>::zeros([state.batch(), n], device);
        lm.prefill(tokens, state);
    }
}
