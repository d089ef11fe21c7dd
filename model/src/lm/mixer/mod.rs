//! The token mixer of a block: HLA (second, third order, asymmetric), first-order linear
//! attention, or softmax attention, behind the same projections, short convolution and
//! output path, so that only the mixing rule differs between them. On CPU devices the
//! default recipe of HLA and linear attention runs as CPU kernels from the projections on
//! ([`qkv`]).

mod features;
#[cfg(cpu_kernels)]
pub(crate) mod qkv;
mod recur;
mod softmax;

use burn::module::Initializer;
use burn::nn::{
    Linear, LinearConfig, RmsNorm, RmsNormConfig, RotaryEncoding, RotaryEncodingConfig,
};
use burn::prelude::*;
use burn::tensor::activation::silu;

use super::conv::{ShortConv, ShortConvConfig};
use super::linear::{linear, project};
use super::norm::rms_norm;
use super::{DecayKind, FeatureMap, LmConfig, MixerKind, Positions};
use crate::hla::{Form, HlaState, Output};

/// Data-dependent gates are `log g = log σ(x) / GATE_TEMPERATURE`, which keeps them near 1
/// at initialisation (as GLA does).
pub const GATE_TEMPERATURE: f64 = 16.0;

/// The L2 feature map is `x / max(‖x‖, L2_EPS)`.
pub const L2_EPS: f64 = 1e-6;

/// The masked denominator is clamped away from zero at `DENOMINATOR_EPS`, keeping its sign.
pub const DENOMINATOR_EPS: f64 = 1e-6;

/// What a mixer carries from one call to the next (per layer).
#[derive(Debug, Clone)]
pub struct MixerState {
    /// Inputs of the short convolution before the next token.
    conv: Option<Tensor<3>>,
    memory: Memory,
}

#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per layer, replaced whole at each call
enum Memory {
    /// HLA and linear attention: the constant-size state.
    Recurrent(HlaState),
    /// HLA and linear attention after the CPU kernel of the serial recurrence: `[state | o]` of its last
    /// call, the state of `batch` sequences packed per head, updated in place by the next.
    Packed { packed: Tensor<1>, batch: usize },
    /// Softmax attention: keys (after RoPE) and values so far, `[batch, heads, time, d]`.
    Cache { k: Tensor<4>, v: Tensor<4> },
    /// Softmax attention after the CPU kernels from qkv: the projected `qkv [batch, time, 3·d]` of
    /// the tokens from position 0, made into a [`Memory::Cache`] when a call needs it.
    Projected(Tensor<3>),
}

/// Fixed per-layer settings (not parameters).
#[derive(Debug, Clone)]
struct Settings {
    kind: MixerKind,
    feature_map: FeatureMap,
    decay: DecayKind,
    /// `b` of the fixed decay `γ_h = 1 − 2^(−b−h)`.
    decay_base: f64,
    heads: usize,
    d_head: usize,
    output: Output,
}

#[derive(Module, Debug)]
pub struct Mixer {
    q: Linear,
    k: Linear,
    v: Linear,
    conv: Option<ShortConv>,
    /// Data-dependent decay: one gate per head and token.
    gate: Option<Linear>,
    /// Per-head RMSNorm of the mixer output.
    out_norm: Option<RmsNorm>,
    out_gate: Option<Linear>,
    out: Linear,
    rope: Option<RotaryEncoding>,
    #[module(skip)]
    settings: Settings,
}

/// A bias-free linear layer with normal(0, std) weights.
fn linear_layer(d_in: usize, d_out: usize, std: f64, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out)
        .with_bias(false)
        .with_initializer(Initializer::Normal { mean: 0.0, std })
        .init(device)
}

impl Mixer {
    pub fn new(config: &LmConfig, device: &Device) -> Self {
        let (d, heads) = (config.d_model, config.n_heads);
        let d_head = d / heads;
        let kind = config.mixer;
        let shared_keys = config.shared_keys && kind != MixerKind::Softmax;
        let d_k = if shared_keys { d_head } else { d };
        let std = config.init_std;
        let gated = config.decay == DecayKind::Gated && kind != MixerKind::Softmax;
        let channels = 2 * d + d_k;
        Self {
            q: linear_layer(d, d, std, device),
            k: linear_layer(d, d_k, std, device),
            v: linear_layer(d, d, std, device),
            conv: (config.short_conv > 0)
                .then(|| ShortConvConfig::new(channels, config.short_conv).init(device)),
            gate: gated.then(|| linear_layer(d, heads, std, device)),
            out_norm: (config.resolved_output_norm() && kind != MixerKind::Softmax)
                .then(|| RmsNormConfig::new(d_head).init(device)),
            out_gate: config.output_gate.then(|| linear_layer(d, d, std, device)),
            out: linear_layer(d, d, config.residual_std(), device),
            rope: (kind == MixerKind::Softmax && config.positions == Positions::Rope)
                .then(|| RotaryEncodingConfig::new(config.max_seq_len, d_head).init(device)),
            settings: Settings {
                kind,
                feature_map: config.resolved_feature_map(),
                decay: config.decay,
                decay_base: config.decay_base,
                heads,
                d_head,
                output: if config.resolved_normalize() {
                    Output::Normalized {
                        eps: DENOMINATOR_EPS,
                    }
                } else {
                    Output::Raw
                },
            },
        }
    }

    /// `x [batch, time, d_model]` → `[batch, time, d_model]`, continuing from `state`
    /// (empty when `None`), and the next state when `keep` (without it, the chunked HLA
    /// makes no final state). HLA and linear attention use `form`; softmax attention is
    /// exact either way.
    pub fn forward(
        &self,
        x: Tensor<3>,
        state: Option<MixerState>,
        form: Form,
        keep: bool,
    ) -> (Tensor<3>, Option<MixerState>) {
        let kept = |conv, memory| keep.then_some(MixerState { conv, memory });
        let (conv_history, memory) = match state {
            Some(s) => (s.conv, Some(s.memory)),
            None => (None, None),
        };
        // q, k and v in one projection `[W_q | W_k | W_v]` (and one convolution).
        let weights = [&self.q, &self.k, &self.v].map(|l| l.weight.val());
        let widths = weights.each_ref().map(|w| w.dims()[1]);
        let qkv = project(x.clone(), Tensor::cat(weights.into(), 1));
        let (qkv, conv) = match &self.conv {
            None => (qkv, None),
            Some(conv) => {
                let (qkv, history) = conv.forward(qkv, conv_history);
                (qkv, Some(history))
            }
        };
        #[cfg(cpu_kernels)]
        if let Some(call) = self.cpu_call(&qkv, widths, form, memory.as_ref()) {
            let (o, memory) = self.recur_on_cpu(&x, qkv, memory, call);
            let o = match &self.out_norm {
                Some(norm) => {
                    let [b, t, d] = o.dims();
                    let dh = self.settings.d_head;
                    rms_norm(norm, o.reshape([b, t, d / dh, dh])).reshape([b, t, d])
                }
                None => o,
            };
            return (self.output(&x, o), kept(conv, memory));
        }
        #[cfg(cpu_kernels)]
        if self.settings.kind == MixerKind::Softmax
            && memory.is_none()
            && crate::backend::takes_cpu_kernel(&qkv)
        {
            let table = self.rope_table(qkv.dims()[1], &qkv.device());
            let o = qkv::attention::forward(qkv.clone(), table, self.settings.heads);
            return (self.output(&x, o), kept(conv, Memory::Projected(qkv)));
        }
        let (q, k, v) = split3(qkv, widths);
        let (q, k, v) = (self.heads(q), self.heads(k), self.heads(v));
        let (o, memory) = match self.settings.kind {
            MixerKind::Softmax => {
                let (o, memory) = self.attend(q, k, v, memory);
                (o, Some(memory))
            }
            _ => self.recur(&x, q, k, v, memory, form, keep),
        };
        let o = match &self.out_norm {
            Some(norm) => rms_norm(norm, o),
            None => o,
        };
        let [b, h, t, dh] = o.dims();
        let o = o.swap_dims(1, 2).reshape([b, t, h * dh]);
        let state = memory.and_then(|memory| kept(conv, memory));
        (self.output(&x, o), state)
    }

    /// The output gate (if any) and projection of the heads' outputs `o [batch, time, d]`.
    fn output(&self, x: &Tensor<3>, mut o: Tensor<3>) -> Tensor<3> {
        if let Some(gate) = &self.out_gate {
            o = o * silu(linear(gate, x.clone()));
        }
        linear(&self.out, o)
    }

    /// `[batch, time, heads·d_head]` → `[batch, heads, time, d_head]`.
    fn heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, t, width] = x.dims();
        let dh = self.settings.d_head;
        x.reshape([b, t, width / dh, dh]).swap_dims(1, 2)
    }

    /// Floats per sequence this layer carries after `context` tokens (the KV cache of
    /// softmax attention grows with it; the others do not).
    pub fn state_size(&self, context: usize, device: &Device) -> usize {
        let s = &self.settings;
        let conv = self.conv.as_ref().map_or(0, ShortConv::state_size);
        let width = s.heads * s.d_head;
        let memory = match s.kind {
            MixerKind::Softmax => 2 * width * context,
            _ => {
                let x = Tensor::zeros([1, 1, width], device);
                let (_, state) = self.forward(x, None, Form::Recurrent, true);
                let state = self.recurrent_state(state.map(|s| s.memory));
                state.expect("a recurrent mixer's state").num_floats()
            }
        };
        memory + conv
    }
}

fn split3(x: Tensor<3>, widths: [usize; 3]) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
    let [a, b, _] = widths;
    (
        x.clone().slice(s![.., .., ..a]),
        x.clone().slice(s![.., .., a..a + b]),
        x.slice(s![.., .., a + b..]),
    )
}
