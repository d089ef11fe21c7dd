//! Second-order masked HLA (docs/math.md §3–§6):
//! `o_t = Σ_{j≤t} Σ_{i≤j} w(t,i) w(t,j) (q_t·k_i)(q_j·k_i) v_j`, with `w(t,x) = Π_{x<s≤t} g_s`.

mod chunked;
#[cfg(cpu_kernels)]
pub(crate) mod cpu;
#[cfg(gpu_kernels)]
pub(crate) mod fused;
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

/// The Z-form state (docs/math.md §3): `S = Σ w k kᵀ` and `Z = Σ_j w² S_j q_j v_jᵀ`.
#[derive(Debug, Clone)]
pub struct State {
    /// Key moment `S`, `[batch, heads or 1, d, d]`.
    pub s: Tensor<4>,
    /// `Z`, `[batch, heads, d, dv]` (last column `z` when normalised).
    pub z: Tensor<4>,
}

impl State {
    /// The zero state of `b` sequences with `h` heads (`sh` for the key moment) and
    /// widths `d`, `dv`.
    pub(crate) fn zeros([b, h, sh]: [usize; 3], [d, dv]: [usize; 2], device: &Device) -> Self {
        let zeros = |heads, rows, cols| Tensor::zeros([b, heads, rows, cols], device);
        Self {
            s: zeros(sh, d, d),
            z: zeros(h, d, dv),
        }
    }

    /// Every tensor, in the order of the fields.
    pub(crate) fn tensors(&self) -> Vec<Tensor<4>> {
        vec![self.s.clone(), self.z.clone()]
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
            z: next(),
        }
    }
}

/// One head's state as `[rows, cols]` parts in the order of [`State`]'s fields:
/// `S [d, d]`, `Z [d, dv]`.
pub(crate) fn state_parts(d: usize, dv: usize) -> Vec<[usize; 2]> {
    vec![[d, d], [d, dv]]
}

/// Floats of one head's state.
pub(crate) fn state_len(d: usize, dv: usize) -> usize {
    crate::hla::packing::head_len(&state_parts(d, dv))
}
