//! Higher-order Linear Attention (HLA), strictly causal ("masked"), per head.
//!
//! Four operators, each in three forms that compute the same numbers:
//!
//! | operator | definition (docs/math.md) | state |
//! |---|---|---|
//! | [`first`] | `o_t = Σ_{j≤t} (q_t·k_j) v_j`, linear attention (§2.2), the baseline | `S` |
//! | [`second`] | `o_t = Σ_{j≤t} Σ_{i≤j} (q_t·k_i)(q_j·k_i) v_j` (§3, §6) | `S, Z` |
//! | [`third`] | `O = ((W Wᵀ) ⊙ L) W V`, the corrected kernel D1 (§8) | `S, P, Y` |
//! | [`ahla`] | `O = ((A A) ⊙ L) V`, asymmetric (§7) | `P, E` |
//!
//! * `reference`: the quadratic definition, O(T²) memory; the ground truth for tests.
//! * `recurrent`: the serial recurrence, one token at a time with a constant state;
//!   used for evaluation and generation.
//! * `chunked`: the chunk-parallel matmul form used for training; takes an initial state
//!   and returns the final one, so a prefix can be processed in parallel and the
//!   recurrence continue from it. Each order's `chunked` is the composed form (Burn's
//!   tensor ops), the one place its chunk equations are written; each order also has a
//!   CPU kernel (`cpu`, every order) and a GPU kernel (`gpu`, every order, gates without a
//!   gradient), which [`forward`] runs instead where they apply (`route`), with the
//!   composed form as their test oracle; and a node (`node`: one autodiff node of
//!   Burn's ops with a hand-written backward pass, on every device, which
//!   [`crate::backend::Kernels::Nodes`] turns on).
//!
//! The order-independent parts of the kernels are leaves here (`cpu`, `gpu`, `node`); the order
//! folders build on them and do not route; `state` holds the one table that maps an
//! [`Order`] to its forms, kernels and state layout.
//!
//! Math: `docs/math.md`. Decay and per-token gates follow the corrected rules
//! of §6 (`Z ← g² Z + (S q) vᵀ`), extended here to third order (`Y ← g³ Y + …`) and
//! AHLA (`E ← g E + …`) with the same product decay: every index of a term decays from
//! its own position to `t`. These extensions are checked in float64 by
//! `model/tests/golden/generate.py`.
//!
//! Tensors are `[batch, heads, time, dim]`. Keys may have one head (shared across heads,
//! multi-query, docs/math.md §11): the key moment `S` is then stored once per layer unless the
//! gates differ per head. The optional masked denominator is computed by appending a
//! value column of ones, so its state (`z`, `y`, `n` in docs/math.md) is the last column of
//! the value-side state (`Z`, `Y`, `E`).

pub mod ahla;
pub(crate) mod chunks;
#[cfg(cpu_kernels)]
pub(crate) mod cpu;
mod decay;
pub mod first;
#[cfg(gpu_kernels)]
pub(crate) mod gpu;
mod input;
#[cfg(all(test, cpu_kernels))]
mod kernel_tests;
#[cfg(any(cpu_kernels, gpu_kernels))]
pub(crate) mod node;
mod normalize;
mod packing;
mod route;
pub mod second;
mod spans;
mod state;
pub mod third;

pub use input::{DEFAULT_DECAY_BASE, HlaError, HlaInput, fixed_log_gates, multi_scale_decay};
pub use normalize::{Output, sign_preserving_clamp};
pub(crate) use packing::{pack_state, unpack_state};
pub use state::HlaState;
#[cfg(cpu_kernels)]
pub(crate) use state::cpu_kernels;
#[cfg(gpu_kernels)]
pub(crate) use state::gpu_kernels;
pub(crate) use state::state_parts;

use burn::prelude::*;

use state::{Operator, with_operator};

/// Which operator.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Order {
    /// First order, causal linear attention (the baseline, docs/math.md §2.2).
    First,
    /// Second order, the HLA of the paper (docs/math.md §3).
    Second,
    /// Third order, the corrected masked kernel (docs/math.md §8).
    Third,
    /// Asymmetric second order, AHLA (docs/math.md §7).
    Asymmetric,
}

/// How a sequence is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The quadratic definition.
    Reference,
    /// Token by token with the constant state.
    Recurrent,
    /// Chunk-parallel with the given chunk size (≥ 1), every chunk in one pass.
    Chunked(usize),
    /// Chunk-parallel in passes of at most `segment` tokens (whole chunks, at least one),
    /// one pass after another carrying the state: bounds the working set of a forward
    /// pass. Each pass's input is a slice, whose gradient Burn builds at the full length,
    /// so for training one pass ([`Form::Chunked`]) is faster.
    Segmented { chunk: usize, segment: usize },
}

impl Form {
    /// Chunk-parallel with `chunk` tokens per chunk, in passes of at most `segment`
    /// tokens; `segment` 0: one pass.
    pub fn passes(chunk: usize, segment: usize) -> Self {
        if segment == 0 {
            Form::Chunked(chunk)
        } else {
            Form::Segmented { chunk, segment }
        }
    }

    /// Runs this form of `O` from `state` (zeros when `None`: the kernels make a zero state
    /// packed, in one buffer, and the node none); returns the final state when `keep`
    /// (the node then makes none).
    fn run<O: Operator>(
        self,
        input: &HlaInput,
        state: Option<O::State>,
        keep: bool,
    ) -> (Tensor<4>, Option<O::State>) {
        let zeros = || state::zeros::<O>(input);
        let (o, state) = match self {
            Form::Reference => O::reference(input, state.unwrap_or_else(zeros)),
            Form::Recurrent => O::recurrent(input, state.unwrap_or_else(zeros)),
            Form::Chunked(chunk) => return route::chunked::<O>(input, state, chunk, keep),
            Form::Segmented { chunk, segment } => {
                let pass = (segment / chunk.max(1)).max(1) * chunk;
                spans::scan(input, state.unwrap_or_else(zeros), pass, |x, s| {
                    let (o, s) = route::chunked::<O>(x, Some(s), chunk, true);
                    (o, s.expect("a state kept"))
                })
            }
        };
        (o, keep.then_some(state))
    }
}

/// Runs `order` over a sequence in the given `form`, starting from `state` (zeros when
/// `None`).
///
/// Shapes: see [`HlaInput`]; output `[batch, heads, time, dv]`. With
/// [`Output::Normalized`], the state carries the denominator as an extra value column;
/// pass states only between calls with the same `output`.
///
/// # Panics
///
/// If `state` belongs to another order than `order`.
pub fn forward(
    order: Order,
    form: Form,
    input: HlaInput,
    state: Option<HlaState>,
    output: Output,
) -> (Tensor<4>, HlaState) {
    let input = output.augment(input);
    let (o, state) = with_operator!(order, O => {
        let (o, s) = form.run::<O>(&input, state.map(O::unwrap), true);
        (o, O::wrap(s.expect("the final state, asked for")))
    });
    (output.finish(o), state)
}

/// [`forward`]'s output alone, for a caller that needs no final state (training, a
/// benchmark): the chunked form's node then makes none, so its output needs no packing
/// and its backward pass no final state's gradient.
pub fn output(
    order: Order,
    form: Form,
    input: HlaInput,
    state: Option<HlaState>,
    output: Output,
) -> Tensor<4> {
    let input = output.augment(input);
    let o = with_operator!(order, O => form.run::<O>(&input, state.map(O::unwrap), false).0);
    output.finish(o)
}

/// One token of the serial recurrence: `input` has `time = 1`; returns `o_t`
/// `[batch, heads, 1, dv]` and the next state.
pub fn step(
    order: Order,
    input: HlaInput,
    state: HlaState,
    output: Output,
) -> (Tensor<4>, HlaState) {
    forward(order, Form::Recurrent, input, Some(state), output)
}
