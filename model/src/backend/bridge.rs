//! An inner (non-autodiff) backend's float primitive as a [`Tensor`] on its own device, and
//! back: what lets a graph node's forward and backward passes be written with Burn's tensor
//! ops, for every device at once, instead of one hand-written kernel per device.

use burn::backend::Backend;
use burn::backend::tensor::FloatTensor;
use burn::prelude::*;

/// A backend of the dispatch whose float primitives convert to and from [`Tensor`]s.
pub(crate) trait Inner: Backend {
    /// `primitive` as a tensor of rank `D` (its rank).
    fn tensor<const D: usize>(primitive: FloatTensor<Self>) -> Tensor<D>;

    /// The primitive of `tensor`, which lives on this backend.
    ///
    /// # Panics
    ///
    /// If `tensor` lives on another backend.
    fn primitive<const D: usize>(tensor: Tensor<D>) -> FloatTensor<Self>;
}

macro_rules! inner {
    ($($backend:ident: $cfg:meta),+ $(,)?) => {$(
        #[cfg($cfg)]
        #[allow(deprecated)] // ndarray stays a supported CPU device while Burn keeps it
        impl Inner for burn::backend::$backend {
            fn tensor<const D: usize>(primitive: FloatTensor<Self>) -> Tensor<D> {
                Tensor::from_primitive::<Self>(primitive)
            }

            fn primitive<const D: usize>(tensor: Tensor<D>) -> FloatTensor<Self> {
                tensor
                    .try_into_primitive::<Self>()
                    .unwrap_or_else(|e| panic!("a node's tensor left its backend: {e:?}"))
            }
        }
    )+};
}

inner!(
    NdArray: feature = "ndarray",
    Flex: feature = "flex",
    Cube: gpu_kernels,
);
