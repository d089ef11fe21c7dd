//! Higher-order Linear Attention (HLA), strictly causal ("masked"), per head.
//!
//! Four operators, each in three forms that compute the same numbers:
//!
//! | operator | definition (spec) | state |
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
//!   recurrence continue from it. It runs as fused kernels where they apply: on CPU
//!   devices (`fused`, every order), on CubeCL devices (`cube`: first, second order and
//!   AHLA, gates without a gradient); elsewhere as the composed form, their test oracle.
//!
//! Spec: `shared/spec/hla-math.md`. Decay and per-token gates follow the corrected rules
//! of §6 (`Z ← g² Z + (S q) vᵀ`), extended here to third order (`Y ← g³ Y + …`) and
//! AHLA (`E ← g E + …`) with the same product decay: every index of a term decays from
//! its own position to `t`. These extensions are checked in float64 by
//! `model/tests/golden/generate.py`.
//!
//! Tensors are `[batch, heads, time, dim]`. Keys may have one head (shared across heads,
//! multi-query, spec §11): the key moment `S` is then stored once per layer unless the
//! gates differ per head. The optional masked denominator is computed by appending a
//! value column of ones, so its state (`z`, `y`, `n` in the spec) is the last column of
//! the value-side state (`Z`, `Y`, `E`).

pub mod ahla;
mod chunks;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) mod cube;
mod decay;
pub mod first;
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) mod fused;
mod input;
mod normalize;
pub mod second;
mod spans;
mod state;
pub mod third;

pub use input::{DEFAULT_DECAY_BASE, HlaError, HlaInput, fixed_log_gates, multi_scale_decay};
pub use normalize::{Output, sign_preserving_clamp};
pub use state::HlaState;
pub(crate) use state::{pack_state, state_parts, unpack_state};

use burn::prelude::*;

/// Which operator.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Order {
    /// First order, causal linear attention (the baseline, spec §2.2).
    First,
    /// Second order, the HLA of the paper (spec §3).
    Second,
    /// Third order, the corrected masked kernel (spec §8).
    Third,
    /// Asymmetric second order, AHLA (spec §7).
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

    /// Runs the form of one operator, given its three forms.
    fn run<S>(
        self,
        input: &HlaInput,
        state: S,
        reference: fn(&HlaInput, S) -> (Tensor<4>, S),
        recurrent: fn(&HlaInput, S) -> (Tensor<4>, S),
        chunked: fn(&HlaInput, S, usize) -> (Tensor<4>, S),
    ) -> (Tensor<4>, S) {
        match self {
            Form::Reference => reference(input, state),
            Form::Recurrent => recurrent(input, state),
            Form::Chunked(chunk) => chunked(input, state, chunk),
            Form::Segmented { chunk, segment } => {
                let pass = (segment / chunk.max(1)).max(1) * chunk;
                spans::scan(input, state, pass, |x, s| chunked(x, s, chunk))
            }
        }
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
    let state = state.unwrap_or_else(|| HlaState::zeros(order, &input, output));
    let input = output.augment(input);
    let (o, state) = match (order, state) {
        (Order::First, HlaState::First(s)) => {
            let (o, s) = form.run(
                &input,
                s,
                first::reference,
                first::recurrent,
                first::chunked,
            );
            (o, HlaState::First(s))
        }
        (Order::Second, HlaState::Second(s)) => {
            let (o, s) = form.run(
                &input,
                s,
                second::reference,
                second::recurrent,
                second::chunked,
            );
            (o, HlaState::Second(s))
        }
        (Order::Third, HlaState::Third(s)) => {
            let (o, s) = form.run(
                &input,
                s,
                third::reference,
                third::recurrent,
                third::chunked,
            );
            (o, HlaState::Third(s))
        }
        (Order::Asymmetric, HlaState::Asymmetric(s)) => {
            let (o, s) = form.run(&input, s, ahla::reference, ahla::recurrent, ahla::chunked);
            (o, HlaState::Asymmetric(s))
        }
        (order, state) => panic!(
            "a {:?} state passed to the {order:?} operator",
            state.order()
        ),
    };
    (output.finish(o), state)
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
