//! AdamW as Burn's (`burn::optim::AdamW`, decoupled weight decay, bias-corrected moments)
//! with its per-parameter gradient-norm clipping, as one CPU kernel per parameter on CPU
//! devices ([`cpu`]): Burn's runs about fifteen elementwise ops per parameter. Elsewhere,
//! and as the test oracle, Burn's own. The state is Burn's `AdamWState`, so optimizer
//! checkpoints are the same either way. The clipping of the global norm of all gradients
//! ([`clip_global_norm`]) runs before it, once per step.

mod clip;
#[cfg(cpu_kernels)]
pub(crate) mod cpu;

pub use clip::{CLIP_EPS, clip_global_norm};

use burn::grad_clipping::GradientClipping;
use burn::optim::{AdamWConfig, AdamWState, AdaptiveMomentumState, LearningRate, Optimizer};
use burn::prelude::*;

/// The settings of AdamW and of the clipping before it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// First-moment decay (Burn's default 0.9).
    pub beta_1: f32,
    /// Second-moment decay.
    pub beta_2: f32,
    /// Added to `√v̂` ([`AdamW::EPSILON`], Burn's default).
    pub epsilon: f32,
    /// Decoupled weight decay `λ`.
    pub weight_decay: f32,
    /// Scale each parameter's gradient down to at most this L2 norm (each on its own; the
    /// global norm is [`clip_global_norm`]'s).
    pub clip_norm: Option<f32>,
}

impl AdamW {
    /// Burn's default `ε`.
    pub const EPSILON: f32 = 1e-5;

    /// Burn's AdamW with the same settings, the composed form.
    fn burn(&self) -> burn::optim::AdamW {
        AdamWConfig::new()
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2)
            .with_epsilon(self.epsilon)
            .with_weight_decay(self.weight_decay)
            .build()
    }

    /// Burn's step (with its clipping): the composed form and test oracle of
    /// [`Optimizer::step`].
    pub fn step_composed<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdamWState<D>>,
    ) -> (Tensor<D>, Option<AdamWState<D>>) {
        let grad = match self.clip_norm {
            Some(norm) => GradientClipping::Norm(norm).clip_gradient(grad),
            None => grad,
        };
        self.burn().step(lr, tensor, grad, state)
    }
}

impl Optimizer for AdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        #[cfg(cpu_kernels)]
        if crate::backend::takes_cpu_kernel(&tensor) {
            use cpu::AdamWCpuOps;
            let (m, v, time) = match state {
                Some(s) => (s.momentum.moment_1, s.momentum.moment_2, s.momentum.time),
                None => (tensor.zeros_like(), tensor.zeros_like(), 0),
            };
            let settings = cpu::Step {
                adamw: *self,
                lr,
                time: time + 1,
            };
            let (p, m, v) = <burn::backend::Dispatch as AdamWCpuOps>::adamw(
                tensor.into_dispatch(),
                grad.into_dispatch(),
                m.into_dispatch(),
                v.into_dispatch(),
                settings,
            );
            let momentum = AdaptiveMomentumState {
                time: time + 1,
                moment_1: Tensor::from_dispatch(m),
                moment_2: Tensor::from_dispatch(v),
                max_moment_2: None,
            };
            return (Tensor::from_dispatch(p), Some(AdamWState { momentum }));
        }
        self.step_composed(lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        <burn::optim::AdamW as Optimizer>::to_device(state, device)
    }
}

#[cfg(all(test, cpu_kernels))]
mod tests {
    use burn::tensor::Distribution;

    use super::*;
    use crate::agreement::relative_rms_error;

    /// Five steps of the CPU kernel of AdamW against Burn's (with its clipping), with and without
    /// clipping and weight decay, gradients large enough to be clipped: parameters and
    /// moments agree.
    #[test]
    fn cpu_adamw_is_burns() {
        #[allow(deprecated)]
        let devices = [
            #[cfg(feature = "ndarray")]
            Device::ndarray(),
            #[cfg(feature = "flex")]
            Device::flex(),
        ];
        for device in devices {
            for (clip_norm, weight_decay) in [(None, 0.0), (Some(1.0), 0.1), (Some(50.0), 0.5)] {
                let adamw = AdamW {
                    beta_1: 0.9,
                    beta_2: 0.99,
                    epsilon: 1e-5,
                    weight_decay,
                    clip_norm,
                };
                let normal = Distribution::Normal(0.0, 1.0);
                let start = Tensor::<2>::random([37, 19], normal, &device);
                let (mut kernel, mut composed) = ((start.clone(), None), (start, None));
                for step in 0..5 {
                    let grad = Tensor::<2>::random([37, 19], normal, &device) * 3.0;
                    let lr = 1e-2 / (1.0 + step as f64);
                    kernel = adamw.step(lr, kernel.0, grad.clone(), kernel.1);
                    composed = adamw.step_composed(lr, composed.0, grad, composed.1);
                    let (f, c) = (kernel.1.clone().unwrap(), composed.1.clone().unwrap());
                    assert_eq!(f.momentum.time, c.momentum.time);
                    let errors = [
                        relative_rms_error(kernel.0.clone(), composed.0.clone()),
                        relative_rms_error(f.momentum.moment_1, c.momentum.moment_1),
                        relative_rms_error(f.momentum.moment_2, c.momentum.moment_2),
                    ];
                    let case = format!("clip {clip_norm:?}, decay {weight_decay}, step {step}");
                    assert!(errors.iter().all(|e| *e < 1e-5), "{case}: {errors:?}");
                }
            }
        }
    }
}
