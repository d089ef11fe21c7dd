//! The short causal depthwise convolution (kernel 3–4) before the token mixer: the
//! Zoology/Based recipe, flash-linear-attention's `ShortConvolution`.

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
        let kernel = self.weight.dims()[0];
        let history =
            history.unwrap_or_else(|| Tensor::zeros([batch, kernel - 1, channels], &x.device()));
        let window = Tensor::cat(vec![history, x], 1);
        let weight = self.weight.val();
        let y = (0..kernel)
            .map(|j| {
                let w = weight.clone().slice(s![j..=j, ..]).unsqueeze::<3>();
                window.clone().slice(s![.., j..j + time, ..]) * w
            })
            .reduce(|a, b| a + b)
            .expect("kernel ≥ 1");
        let history = window.slice(s![.., time.., ..]);
        (silu(y), history)
    }

    /// Floats of history per sequence.
    pub fn state_size(&self) -> usize {
        let [kernel, channels] = self.weight.dims();
        (kernel - 1) * channels
    }
}
