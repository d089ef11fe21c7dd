//! Global-norm gradient clipping, as PyTorch's `clip_grad_norm_` (and so nanoGPT's): the L2
//! norm of all of a step's gradients together, `total = √(Σ_p ‖g_p‖²)`; past `max_norm`,
//! every gradient is scaled by `max_norm / (total + ε)`. It runs once per optimiser step on
//! the step's final gradient (accumulated, added up from every device), before AdamW.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;

/// `ε` of the scale `max_norm / (total + ε)` (PyTorch's).
pub const CLIP_EPS: f64 = 1e-6;

/// Scales the gradients of `module`'s parameters in `grads` so that their global L2 norm is
/// at most `max_norm`; returns the norm before clipping.
pub fn clip_global_norm<M: Module>(module: &M, grads: &mut GradientsParams, max_norm: f64) -> f64 {
    let mut squares = Squares {
        grads,
        sums: Vec::new(),
    };
    module.visit(&mut squares);
    let total = global_norm(squares.sums);
    if total > max_norm {
        let factor = max_norm / (total + CLIP_EPS);
        module.visit(&mut Scale { grads, factor });
    }
    total
}

/// `√(Σ sums)` of the per-parameter sums of squares, read back at once and added in f64.
fn global_norm(sums: Vec<Tensor<1>>) -> f64 {
    let Some(device) = sums.first().map(Tensor::device) else {
        return 0.0;
    };
    let sums: Vec<Tensor<1>> = sums.into_iter().map(|s| s.to_device(&device)).collect();
    let data = Tensor::cat(sums, 0).into_data();
    let total: f64 = data.iter::<f32>().map(f64::from).sum();
    total.sqrt()
}

/// Collects `Σ g²` of each parameter's gradient.
struct Squares<'a> {
    grads: &'a GradientsParams,
    sums: Vec<Tensor<1>>,
}

impl ModuleVisitor for Squares<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            self.sums.push(g.square().sum());
        }
    }
}

/// Multiplies each parameter's gradient by `factor`.
struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g * self.factor);
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Distribution;

    use super::*;
    use crate::lm::LmConfig;
    use crate::testing::cpu_devices;

    /// Every gradient of a model's parameters, flattened, in visiting order.
    fn flat(module: &impl Module, grads: &GradientsParams) -> Vec<Vec<f32>> {
        struct Flat<'a>(&'a GradientsParams, Vec<Vec<f32>>);
        impl ModuleVisitor for Flat<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let g = self.0.get::<D>(param.id).expect("a gradient");
                self.1.push(g.into_data().iter::<f32>().collect());
            }
        }
        let mut flat = Flat(grads, Vec::new());
        module.visit(&mut flat);
        flat.1
    }

    /// On a language model's gradients (a dozen parameters, norm far above the limit), the
    /// global clip equals the formula computed apart, in f64 from the gradients' values:
    /// one scale for all, within 1e-6 relative; under a limit above the norm, nothing
    /// changes.
    #[test]
    fn global_clip_is_clip_grad_norm() {
        for device in cpu_devices() {
            let config = LmConfig::new(29)
                .with_d_model(16)
                .with_n_heads(2)
                .with_n_layers(2)
                .with_chunk_size(4);
            let lm = config.init(&device);
            let ids = Tensor::<2>::random([2, 9], Distribution::Uniform(0.0, 29.0), &device).int();
            let weights = Tensor::<3>::random([2, 9, 29], Distribution::Normal(0.0, 1.0), &device);
            let grads = || {
                let loss = (lm.forward(ids.clone()) * weights.clone() * 100.0).sum();
                GradientsParams::from_grads(loss.backward(), &lm)
            };
            let mut clipped = grads();
            let before = flat(&lm, &clipped);
            assert!(before.len() > 10, "{} parameters", before.len());
            let squares: f64 = before.iter().flatten().map(|g| f64::from(*g).powi(2)).sum();
            let norm = squares.sqrt();
            let max_norm = 0.5;
            assert!(norm > 10.0 * max_norm, "the norm {norm} needs clipping");

            let total = clip_global_norm(&lm, &mut clipped, max_norm);
            assert!((total - norm).abs() <= 1e-6 * norm, "{total} vs {norm}");
            let factor = max_norm / (norm + CLIP_EPS);
            let (mut error, mut size) = (0.0f64, 0.0f64);
            for (got, want) in flat(&lm, &clipped).iter().zip(&before) {
                for (g, w) in got.iter().zip(want) {
                    let w = f64::from(*w) * factor;
                    error += (f64::from(*g) - w).powi(2);
                    size += w * w;
                }
            }
            let relative = (error / size).sqrt();
            assert!(
                relative <= 1e-6,
                "{device:?}: relative error {relative:.2e}"
            );

            let mut kept = grads();
            let unclipped = flat(&lm, &kept);
            clip_global_norm(&lm, &mut kept, 2.0 * norm);
            assert_eq!(
                flat(&lm, &kept),
                unclipped,
                "{device:?}: no clip below the limit"
            );
        }
    }
}
