//! First order: causal linear attention, `o_t = Σ_{j≤t} w(t,j) (q_t·k_j) v_j` (spec §2.2),
//! the baseline HLA is compared with, in the same three forms and with the same options.

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

/// The state `S = Σ_j w k_j v_jᵀ`.
#[derive(Debug, Clone)]
pub struct State {
    /// `S`, `[batch, heads, d, dv]` (last column `Σ w k` when normalised).
    pub s: Tensor<4>,
}
