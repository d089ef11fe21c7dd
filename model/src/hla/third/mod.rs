//! Third-order masked HLA, the corrected kernel D1 (spec §8):
//! `o_t = Σ_{u≤t} Σ_{i≤u} Σ_{j≤u} w(t,i) w(t,u) w(t,j) (q_t·k_i)(q_u·k_i)(q_u·k_j) v_j`,
//! i.e. `O = ((W Wᵀ) ⊙ L) W V` without decay. The paper's Algorithm 3 computes a
//! different operator (spec §8 [E]); gates use the product decay of §6 (derived here).

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

/// The D1 state (spec §8): `S = Σ w k kᵀ`, `P = Σ w k vᵀ`, `Y = Σ_u w³ (S_u q_u)(q_uᵀ P_u)`.
#[derive(Debug, Clone)]
pub struct State {
    /// Key moment `S`, `[batch, heads or 1, d, d]`.
    pub s: Tensor<4>,
    /// `P`, `[batch, heads, d, dv]` (last column `m^K` when normalised).
    pub p: Tensor<4>,
    /// `Y`, `[batch, heads, d, dv]` (last column `y` when normalised).
    pub y: Tensor<4>,
}
