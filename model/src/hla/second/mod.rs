//! Second-order masked HLA (spec §3–§6):
//! `o_t = Σ_{j≤t} Σ_{i≤j} w(t,i) w(t,j) (q_t·k_i)(q_j·k_i) v_j`, with `w(t,x) = Π_{x<s≤t} g_s`.

mod chunked;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) mod cube;
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) mod fused;
pub(crate) mod recurrent;
mod reference;

pub use chunked::{chunked, chunked_composed};
pub use recurrent::{recurrent, step};
pub use reference::reference;

use burn::prelude::*;

/// The Z-form state (spec §3): `S = Σ w k kᵀ` and `Z = Σ_j w² S_j q_j v_jᵀ`.
#[derive(Debug, Clone)]
pub struct State {
    /// Key moment `S`, `[batch, heads or 1, d, d]`.
    pub s: Tensor<4>,
    /// `Z`, `[batch, heads, d, dv]` (last column `z` when normalised).
    pub z: Tensor<4>,
}
