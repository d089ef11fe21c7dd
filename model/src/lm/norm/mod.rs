//! RMSNorm over the last dimension, `y = x / √(mean(x²) + ε) ⊙ γ` (Burn's `RmsNorm`), as one
//! fused kernel on CPU devices ([`fused`]).

pub(crate) mod fused;

use burn::nn::RmsNorm;
use burn::prelude::*;

/// `norm` (its gain `γ [d]` and ε) applied to `x [.., d]`; Burn's `RmsNorm::forward` is the
/// composed form and the test oracle.
pub fn rms_norm<const D: usize>(norm: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    if crate::fused::applies(&x) {
        use crate::fused::FusedOps;
        let gamma = norm.gamma.val().into_dispatch();
        let y =
            <burn::backend::Dispatch as FusedOps>::rms_norm(x.into_dispatch(), gamma, norm.epsilon);
        return Tensor::from_dispatch(y);
    }
    norm.forward(x)
}
