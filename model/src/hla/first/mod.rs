//! First order: causal linear attention, `o_t = Σ_{j≤t} w(t,j) (q_t·k_j) v_j` (docs/math.md §2.2),
//! the baseline HLA is compared with, in the same three forms and with the same options.

mod chunked;
#[cfg(cpu_kernels)]
pub(crate) mod cpu;
#[cfg(gpu_kernels)]
pub(crate) mod gpu;
#[cfg(any(cpu_kernels, gpu_kernels))]
pub(crate) mod node;
mod recurrent;
mod reference;

pub use chunked::chunked;
pub use recurrent::{recurrent, step};
pub use reference::reference;

use burn::prelude::*;

/// The state `S = Σ_j w k_j v_jᵀ`.
#[derive(Debug, Clone)]
pub struct State {
    /// `S`, `[batch, heads, d, dv]` (last column `Σ w k` when normalised).
    pub s: Tensor<4>,
}

impl State {
    /// The zero state of `b` sequences with `h` heads (`sh` for the key moment) and
    /// widths `d`, `dv`.
    pub(crate) fn zeros([b, h, _]: [usize; 3], [d, dv]: [usize; 2], device: &Device) -> Self {
        let zeros = |heads, rows, cols| Tensor::zeros([b, heads, rows, cols], device);
        Self { s: zeros(h, d, dv) }
    }

    /// Every tensor, in the order of the fields.
    pub(crate) fn tensors(&self) -> Vec<Tensor<4>> {
        vec![self.s.clone()]
    }

    /// The inverse of [`State::tensors`].
    ///
    /// # Panics
    ///
    /// If `tensors` has too few.
    pub(crate) fn from_tensors(tensors: Vec<Tensor<4>>) -> Self {
        let mut it = tensors.into_iter();
        let mut next = || it.next().expect("too few state tensors");
        Self { s: next() }
    }
}

/// One head's state as `[rows, cols]` parts in the order of [`State`]'s fields:
/// `S [d, dv]`.
pub(crate) fn state_parts(d: usize, dv: usize) -> Vec<[usize; 2]> {
    vec![[d, dv]]
}

/// Floats of one head's state.
pub(crate) fn state_len(d: usize, dv: usize) -> usize {
    crate::hla::packing::head_len(&state_parts(d, dv))
}
