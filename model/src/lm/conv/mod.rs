//! The short causal depthwise convolution (kernel 3–4) before the token mixer: the
//! Zoology/Based recipe, flash-linear-attention's `ShortConvolution`. On CPU devices the
//! convolution and its SiLU are one CPU kernel ([`cpu`]).

pub(crate) mod cpu;

use burn::module::{Initializer, Param};
use burn::prelude::*;
use burn::tensor::activation::silu;

#[derive(Config, Debug)]
pub struct ShortConvConfig {
    /// Channels, each convolved on its own.
    pub channels: usize,
    /// Kernel size (≥ 2).
    pub kernel: usize,
}

/// `y_t = silu(Σ_{j<kernel} w_j ⊙ x_{t−kernel+1+j})`, zeros before the first token.
#[derive(Module, Debug)]
pub struct ShortConv {
    /// `[kernel, channels]`.
    weight: Param<Tensor<2>>,
}

impl ShortConvConfig {
    pub fn init(&self, device: &Device) -> ShortConv {
        // PyTorch's default for a depthwise Conv1d: fan-in is the kernel size.
        let bound = 1.0 / (self.kernel as f64).sqrt();
        let init = Initializer::Uniform {
            min: -bound,
            max: bound,
        };
        ShortConv {
            weight: init.init([self.kernel, self.channels], device),
        }
    }
}

impl ShortConv {
    /// `x [batch, time, channels]`; `history [batch, kernel − 1, channels]` holds the inputs
    /// before `x` (zeros when `None`). Returns `y [batch, time, channels]` and the history
    /// after `x`, so that a sequence can be fed in pieces.
    pub fn forward(&self, x: Tensor<3>, history: Option<Tensor<3>>) -> (Tensor<3>, Tensor<3>) {
        let [batch, time, channels] = x.dims();
        let lead = self.weight.dims()[0] - 1;
        let next = if time >= lead && lead > 0 {
            x.clone().narrow(1, time - lead, lead)
        } else {
            let before = history
                .clone()
                .unwrap_or_else(|| Tensor::zeros([batch, lead, channels], &x.device()));
            Tensor::cat(vec![before, x.clone()], 1).narrow(1, time, lead)
        };
        (convolve(x, history, self.weight.val()), next)
    }

    /// Floats of history per sequence.
    pub fn state_size(&self) -> usize {
        let [kernel, channels] = self.weight.dims();
        (kernel - 1) * channels
    }
}

/// `silu(Σ_j W_j ⊙ window_{t+j})` over the window of `history [batch, kernel − 1, channels]`
/// (zeros when `None`) then `x [batch, time, channels]`, with `W [kernel, channels]` →
/// `[batch, time, channels]`.
pub fn convolve(x: Tensor<3>, history: Option<Tensor<3>>, weight: Tensor<2>) -> Tensor<3> {
    let [batch, _, channels] = x.dims();
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&x) {
        use cpu::ConvCpuOps;
        let history = history.unwrap_or_else(|| Tensor::zeros([batch, 0, channels], &x.device()));
        let y = <burn::backend::Dispatch as ConvCpuOps>::short_conv(
            x.into_dispatch(),
            history.into_dispatch(),
            weight.into_dispatch(),
        );
        return Tensor::from_dispatch(y);
    }
    let lead = weight.dims()[0] - 1;
    let history = history.unwrap_or_else(|| Tensor::zeros([batch, lead, channels], &x.device()));
    convolve_composed(Tensor::cat(vec![history, x], 1), weight)
}

/// The composed form of [`convolve`] on the window `[batch, kernel − 1 + time, channels]`,
/// its test oracle.
pub fn convolve_composed(window: Tensor<3>, weight: Tensor<2>) -> Tensor<3> {
    let kernel = weight.dims()[0];
    let time = window.dims()[1] + 1 - kernel;
    let y = (0..kernel)
        .map(|j| {
            let w = weight.clone().slice(s![j..=j, ..]).unsqueeze::<3>();
            window.clone().slice(s![.., j..j + time, ..]) * w
        })
        .reduce(|a, b| a + b)
        .expect("kernel ≥ 1");
    silu(y)
}
