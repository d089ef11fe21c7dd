//! The feature maps of queries and keys before HLA or linear attention (the CPU mixer kernels'
//! kernels in [`super::tokens`] compute the same maps by hand).

use burn::prelude::*;

use super::L2_EPS;
use crate::lm::FeatureMap;

impl FeatureMap {
    /// Applies the map to queries and keys `[batch, heads, time, d]`.
    pub(super) fn apply(self, q: Tensor<4>, k: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        match self {
            Self::Identity => (q, k),
            Self::L2 => (l2_normalize(q), l2_normalize(k)),
            Self::Scale => {
                let d = q.dims()[3] as f64;
                (q / d.sqrt(), k)
            }
            Self::EluPlusOne => (elu_plus_one(q), elu_plus_one(k)),
        }
    }
}

/// `x / max(‖x‖, L2_EPS)` over the last dimension.
fn l2_normalize(x: Tensor<4>) -> Tensor<4> {
    let norm = x.clone().square().sum_dim(3).sqrt().clamp_min(L2_EPS);
    x / norm
}

/// `elu(x) + 1`, as `max(x, 0) + exp(min(x, 0))`. Burn's `elu` takes `exp` of every
/// element and then selects, so above x ≈ 88 its gradient is `0 · ∞ = NaN` (it stopped
/// MQAR runs with the ratio normalisation at lr 3e-3).
fn elu_plus_one(x: Tensor<4>) -> Tensor<4> {
    x.clone().clamp_min(0.0) + x.clamp_max(0.0).exp()
}

#[cfg(all(test, cpu_kernels))]
mod tests {
    use burn::tensor::TensorData;

    use super::*;
    use crate::testing::cpu_devices as devices;

    /// The map's values and input gradients (of the sum of the mapped q and k) at `x`.
    fn value_and_grad(map: FeatureMap, x: &[f32], device: &Device) -> (Vec<f32>, Vec<f32>) {
        let x = Tensor::<4>::from_data(TensorData::new(x.to_vec(), [1, 1, 1, x.len()]), device)
            .require_grad();
        let (q, k) = map.apply(x.clone(), x.clone());
        let grads = (q.clone() + k).sum().backward();
        let grad = x.grad(&grads).expect("x is tracked");
        (
            q.into_data().try_to_vec::<f32>().unwrap(),
            grad.into_data().try_to_vec::<f32>().unwrap(),
        )
    }

    #[test]
    fn elu_plus_one_is_finite_far_from_zero() {
        let x = [200.0, 1.0, 0.5, -1.0, -200.0];
        let expected_y = [201.0, 2.0, 1.5, (-1.0f32).exp(), 0.0];
        // d/dx (q + k) = 2 · map'(x): 2 above zero, 2·exp(x) below.
        let expected_dx = [2.0, 2.0, 2.0, 2.0 * (-1.0f32).exp(), 0.0];
        for device in devices() {
            let (y, dx) = value_and_grad(FeatureMap::EluPlusOne, &x, &device);
            for i in 0..x.len() {
                assert!((y[i] - expected_y[i]).abs() < 1e-6, "{device:?}: {y:?}");
                assert!((dx[i] - expected_dx[i]).abs() < 1e-6, "{device:?}: {dx:?}");
            }
        }
    }
}
