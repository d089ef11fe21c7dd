//! Third-order masked HLA, the corrected kernel D1 (docs/math.md §8):
//! `o_t = Σ_{u≤t} Σ_{i≤u} Σ_{j≤u} w(t,i) w(t,u) w(t,j) (q_t·k_i)(q_u·k_i)(q_u·k_j) v_j`,
//! i.e. `O = ((W Wᵀ) ⊙ L) W V` without decay. The paper's Algorithm 3 computes a
//! different operator (docs/math.md §8 [E]); gates use the product decay of §6 (derived here).

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

/// The D1 state (docs/math.md §8): `S = Σ w k kᵀ`, `P = Σ w k vᵀ`, `Y = Σ_u w³ (S_u q_u)(q_uᵀ P_u)`.
#[derive(Debug, Clone)]
pub struct State {
    /// Key moment `S`, `[batch, heads or 1, d, d]`.
    pub s: Tensor<4>,
    /// `P`, `[batch, heads, d, dv]` (last column `m^K` when normalised).
    pub p: Tensor<4>,
    /// `Y`, `[batch, heads, d, dv]` (last column `y` when normalised).
    pub y: Tensor<4>,
}

impl State {
    /// The zero state of `b` sequences with `h` heads (`sh` for the key moment) and
    /// widths `d`, `dv`.
    pub(crate) fn zeros([b, h, sh]: [usize; 3], [d, dv]: [usize; 2], device: &Device) -> Self {
        let zeros = |heads, rows, cols| Tensor::zeros([b, heads, rows, cols], device);
        Self {
            s: zeros(sh, d, d),
            p: zeros(h, d, dv),
            y: zeros(h, d, dv),
        }
    }

    /// Every tensor, in the order of the fields.
    pub(crate) fn tensors(&self) -> Vec<Tensor<4>> {
        vec![self.s.clone(), self.p.clone(), self.y.clone()]
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
            s: next(),
            p: next(),
            y: next(),
        }
    }
}

/// One head's state as `[rows, cols]` parts in the order of [`State`]'s fields:
/// `S [d, d]`, `P`, `Y [d, dv]`.
pub(crate) fn state_parts(d: usize, dv: usize) -> Vec<[usize; 2]> {
    vec![[d, d], [d, dv], [d, dv]]
}

/// Floats of one head's state.
pub(crate) fn state_len(d: usize, dv: usize) -> usize {
    crate::hla::packing::head_len(&state_parts(d, dv))
}
