//! Asymmetric second-order HLA, AHLA (spec §7):
//! `o_t = Σ_{j≤t} Σ_{i=j..t} w(t,j) (q_t·k_i)(q_i·k_j) v_j`, i.e. `O = ((A A) ⊙ L) V`
//! with `A = L ⊙ (Q Kᵀ)` without decay. Gates weight each term by `w(t, j)`, as the
//! paper's Algorithm 2 does for a fixed γ.

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

/// The AHLA state (spec §7): `P = Σ w k vᵀ` and `E = Σ_i w k_i (q_iᵀ P_i)`; no d×d state.
#[derive(Debug, Clone)]
pub struct State {
    /// `P`, `[batch, heads, d, dv]` (last column `m^K` when normalised).
    pub p: Tensor<4>,
    /// `E`, `[batch, heads, d, dv]` (last column `n` when normalised).
    pub e: Tensor<4>,
}
