//! Asymmetric second-order HLA, AHLA (docs/math.md §7):
//! `o_t = Σ_{j≤t} Σ_{i=j..t} w(t,j) (q_t·k_i)(q_i·k_j) v_j`, i.e. `O = ((A A) ⊙ L) V`
//! with `A = L ⊙ (Q Kᵀ)` without decay. Gates weight each term by `w(t, j)`, as the
//! paper's Algorithm 2 does for a fixed γ.

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

/// The AHLA state (docs/math.md §7): `P = Σ w k vᵀ` and `E = Σ_i w k_i (q_iᵀ P_i)`; no d×d state.
#[derive(Debug, Clone)]
pub struct State {
    /// `P`, `[batch, heads, d, dv]` (last column `m^K` when normalised).
    pub p: Tensor<4>,
    /// `E`, `[batch, heads, d, dv]` (last column `n` when normalised).
    pub e: Tensor<4>,
}

impl State {
    /// The zero state of `b` sequences with `h` heads (`sh` for the key moment) and
    /// widths `d`, `dv`.
    pub(crate) fn zeros([b, h, _]: [usize; 3], [d, dv]: [usize; 2], device: &Device) -> Self {
        let zeros = |heads, rows, cols| Tensor::zeros([b, heads, rows, cols], device);
        Self {
            p: zeros(h, d, dv),
            e: zeros(h, d, dv),
        }
    }

    /// Every tensor, in the order of the fields.
    pub(crate) fn tensors(&self) -> Vec<Tensor<4>> {
        vec![self.p.clone(), self.e.clone()]
    }

    /// The inverse of [`State::tensors`].
    ///
    /// # Panics
    ///
    /// If `tensors` has too few.
    pub(crate) fn from_tensors(tensors: Vec<Tensor<4>>) -> Self {
        let mut it = tensors.into_iter();
        let mut next = || it.next().expect("too few state tensors");
        Self {
            p: next(),
            e: next(),
        }
    }
}

/// One head's state as `[rows, cols]` parts in the order of [`State`]'s fields:
/// `P`, `E [d, dv]`.
pub(crate) fn state_parts(d: usize, dv: usize) -> Vec<[usize; 2]> {
    vec![[d, dv], [d, dv]]
}

/// Floats of one head's state.
pub(crate) fn state_len(d: usize, dv: usize) -> usize {
    crate::hla::packing::head_len(&state_parts(d, dv))
}
