//! RMSNorm over the last dimension, `y = x / √(mean(x²) + ε) ⊙ γ` (Burn's `RmsNorm`), as one
//! CPU kernel on CPU devices ([`cpu`]).

pub(crate) mod cpu;

use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use super::NormKind;

/// A pre-norm of `kind` over `d` features, as the pair of fields its owner keeps: exactly
/// one is `Some`. Two optional fields (not an enum module) keep an RMSNorm's parameter path
/// (`…norm.gamma`) the same as before LayerNorm existed.
pub fn pre_norm(kind: NormKind, d: usize, device: &Device) -> (Option<RmsNorm>, Option<LayerNorm>) {
    match kind {
        NormKind::Rms => (Some(RmsNormConfig::new(d).init(device)), None),
        NormKind::Layer => (
            None,
            Some(LayerNormConfig::new(d).with_bias(false).init(device)),
        ),
    }
}

/// `x [.., d]` through the pre-norm of [`pre_norm`].
pub fn either<const D: usize>(
    rms: &Option<RmsNorm>,
    layer: &Option<LayerNorm>,
    x: Tensor<D>,
) -> Tensor<D> {
    match (rms, layer) {
        (Some(norm), _) => rms_norm(norm, x),
        (None, Some(norm)) => norm.forward(x),
        (None, None) => unreachable!("pre_norm builds one of the two"),
    }
}

/// `norm` (its gain `γ [d]` and ε) applied to `x [.., d]`; Burn's `RmsNorm::forward` is the
/// composed form and the test oracle.
pub fn rms_norm<const D: usize>(norm: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&x) {
        use cpu::NormCpuOps;
        let gamma = norm.gamma.val().into_dispatch();
        let y = <burn::backend::Dispatch as NormCpuOps>::rms_norm(
            x.into_dispatch(),
            gamma,
            norm.epsilon,
        );
        return Tensor::from_dispatch(y);
    }
    norm.forward(x)
}
