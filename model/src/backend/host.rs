//! The f32 values of a CPU backend's tensor as a slice on the host, and back: what lets one
//! kernel serve every CPU backend.

use std::borrow::Cow;

use burn::backend::Backend;
use burn::backend::tensor::FloatTensor;
use burn::tensor::{Shape, TensorData};

/// A backend whose float tensors live in host memory.
pub(crate) trait Host: Backend {
    /// The values in row-major order, borrowed when the tensor is contiguous.
    ///
    /// # Panics
    ///
    /// If the tensor is not f32 (the router sends only f32 tensors here).
    fn values(tensor: &FloatTensor<Self>) -> Cow<'_, [f32]>;

    /// The values in row-major order, owned: the tensor's own buffer when nothing else
    /// shares it (as [`Host::values`] for the panics).
    fn into_values(tensor: FloatTensor<Self>) -> Vec<f32>;

    /// A tensor holding `values` (row-major) in `shape`, without a copy.
    fn tensor(values: Vec<f32>, shape: Shape) -> FloatTensor<Self>;
}

#[cfg(feature = "ndarray")]
#[allow(deprecated)] // ndarray stays a supported CPU device while Burn keeps it
mod ndarray {
    use super::*;
    use burn::backend::NdArray;
    use burn::backend::TensorMetadata;
    use burn::backend::ndarray::NdArrayTensor;

    impl Host for NdArray {
        fn values(tensor: &NdArrayTensor) -> Cow<'_, [f32]> {
            let NdArrayTensor::F32(storage) = tensor else {
                panic!("CPU kernels take f32 tensors, got {:?}", tensor.dtype());
            };
            let view = storage.view();
            match view.to_slice() {
                Some(values) => Cow::Borrowed(values),
                None => Cow::Owned(view.iter().copied().collect()),
            }
        }

        fn into_values(tensor: NdArrayTensor) -> Vec<f32> {
            let NdArrayTensor::F32(storage) = tensor else {
                panic!("CPU kernels take f32 tensors, got {:?}", tensor.dtype());
            };
            let array = storage.into_owned().into_owned();
            if array.is_standard_layout() {
                let (values, offset) = array.into_raw_vec_and_offset();
                match offset {
                    Some(0) | None => values,
                    Some(offset) => values[offset..].to_vec(),
                }
            } else {
                array.iter().copied().collect()
            }
        }

        fn tensor(values: Vec<f32>, shape: Shape) -> NdArrayTensor {
            NdArrayTensor::from_data(TensorData::new(values, shape))
        }
    }
}

#[cfg(feature = "flex")]
mod flex {
    use super::*;
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;

    impl Host for Flex {
        fn values(tensor: &FlexTensor) -> Cow<'_, [f32]> {
            match tensor.as_slice::<f32>() {
                Some(values) => Cow::Borrowed(values),
                None => {
                    let contiguous = tensor.to_contiguous();
                    let values = contiguous.as_slice::<f32>().unwrap_or_else(|| {
                        panic!("CPU kernels take f32 tensors, got {:?}", tensor.dtype())
                    });
                    Cow::Owned(values.to_vec())
                }
            }
        }

        fn into_values(tensor: FlexTensor) -> Vec<f32> {
            let dtype = tensor.dtype();
            tensor
                .into_data()
                .try_into_vec::<f32>()
                .unwrap_or_else(|_| panic!("CPU kernels take f32 tensors, got {dtype:?}"))
        }

        fn tensor(values: Vec<f32>, shape: Shape) -> FlexTensor {
            FlexTensor::from_data(TensorData::new(values, shape))
        }
    }
}
