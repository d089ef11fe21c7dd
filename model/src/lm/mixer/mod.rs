//! The token mixer of a block: HLA (second, third order, asymmetric), first-order linear
//! attention, or softmax attention, behind the same projections, short convolution and
//! output path, so that only the mixing rule differs between them. On CPU devices the
//! default recipe of HLA and linear attention runs fused from the projections on
//! ([`tokens`]).

mod features;
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) mod tokens;

use burn::module::Initializer;
use burn::nn::{
    Linear, LinearConfig, RmsNorm, RmsNormConfig, RotaryEncoding, RotaryEncodingConfig,
};
use burn::prelude::*;
use burn::tensor::activation::{log_sigmoid, silu};

use super::attention::causal_attention;
use super::conv::{ShortConv, ShortConvConfig};
use super::linear::{linear, project};
use super::norm::rms_norm;
use super::{DecayKind, FeatureMap, LmConfig, MixerKind, Positions};
use crate::hla::{
    self, Form, HlaInput, HlaState, Order, Output, fixed_log_gates, multi_scale_decay,
};

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
    /// Softmax attention: keys (after RoPE) and values so far, `[batch, heads, time, d]`.
    Cache { k: Tensor<4>, v: Tensor<4> },
    /// Softmax attention after the fused mixer: the projected `qkv [batch, time, 3·d]` of
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
    /// (empty when `None`). HLA and linear attention use `form`; softmax attention is
    /// exact either way.
    pub fn forward(
        &self,
        x: Tensor<3>,
        state: Option<MixerState>,
        form: Form,
    ) -> (Tensor<3>, MixerState) {
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
        #[cfg(any(feature = "ndarray", feature = "flex"))]
        if let Some(tokens) = self.fused(&qkv, widths, form, memory.as_ref()) {
            let (o, memory) = self.recur_fused(&x, qkv, memory, tokens);
            return (self.output(&x, o), MixerState { conv, memory });
        }
        #[cfg(any(feature = "ndarray", feature = "flex"))]
        if self.settings.kind == MixerKind::Softmax
            && memory.is_none()
            && crate::fused::applies(&qkv)
        {
            let table = self.rope_table(qkv.dims()[1], &qkv.device());
            let o = tokens::attention::forward(qkv.clone(), table, self.settings.heads);
            let memory = Memory::Projected(qkv);
            return (self.output(&x, o), MixerState { conv, memory });
        }
        let (q, k, v) = split3(qkv, widths);
        let (q, k, v) = (self.heads(q), self.heads(k), self.heads(v));
        let (o, memory) = match self.settings.kind {
            MixerKind::Softmax => self.attend(q, k, v, memory),
            _ => self.recur(&x, q, k, v, memory, form),
        };
        let o = match &self.out_norm {
            Some(norm) => rms_norm(norm, o),
            None => o,
        };
        let [b, h, t, dh] = o.dims();
        let o = o.swap_dims(1, 2).reshape([b, t, h * dh]);
        (self.output(&x, o), MixerState { conv, memory })
    }

    /// The output gate (if any) and projection of the heads' outputs `o [batch, time, d]`.
    fn output(&self, x: &Tensor<3>, mut o: Tensor<3>) -> Tensor<3> {
        if let Some(gate) = &self.out_gate {
            o = o * silu(linear(gate, x.clone()));
        }
        linear(&self.out, o)
    }

    /// The fused mixer's settings, if it computes this call: HLA of any order or linear
    /// attention in one chunk-parallel pass, keys per head, on a CPU device.
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    fn fused(
        &self,
        qkv: &Tensor<3>,
        widths: [usize; 3],
        form: Form,
        memory: Option<&Memory>,
    ) -> Option<tokens::Tokens> {
        let s = &self.settings;
        let order = self.order()?;
        let Form::Chunked(chunk) = form else {
            return None;
        };
        let plain = widths[0] == widths[1] && matches!(memory, None | Some(Memory::Recurrent(_)));
        (plain && crate::fused::applies(qkv)).then_some(tokens::Tokens {
            order,
            heads: s.heads,
            map: s.feature_map,
            chunk,
            denominator: match s.output {
                Output::Raw => None,
                Output::Normalized { eps } => Some(eps as f32),
            },
            gates: false,
        })
    }

    /// [`Self::recur`] by the fused mixer: `qkv [batch, time, 3·d]` → the heads' outputs
    /// after the denominator and the output norm, `[batch, time, d]`.
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    fn recur_fused(
        &self,
        x: &Tensor<3>,
        qkv: Tensor<3>,
        memory: Option<Memory>,
        mut tokens: tokens::Tokens,
    ) -> (Tensor<3>, Memory) {
        let s = &self.settings;
        let [b, t, _] = qkv.dims();
        let (h, dh) = (s.heads, s.d_head);
        let device = qkv.device();
        let log_g = self
            .log_gates(x, t, &device)
            .unwrap_or_else(|| Tensor::zeros([1, 1, t], &device));
        tokens.gates = log_g.is_tracked();
        let state = match memory {
            Some(Memory::Recurrent(state)) => state,
            Some(Memory::Cache { .. } | Memory::Projected(_)) => {
                unreachable!("a KV cache passed to a recurrent mixer")
            }
            None => {
                let zeros = |[rows, cols]: [usize; 2]| Tensor::zeros([b, h, rows, cols], &device);
                let parts = tokens.state_parts(dh).into_iter().map(zeros).collect();
                HlaState::from_tensors(tokens.order, parts)
            }
        };
        let (o, state) = tokens::recurrent::forward(qkv, log_g, state, tokens);
        let o = match &self.out_norm {
            Some(norm) => rms_norm(norm, o.reshape([b, t, h, dh])).reshape([b, t, h * dh]),
            None => o,
        };
        (o, Memory::Recurrent(state))
    }

    /// The operator of HLA and linear attention (`None` for softmax attention).
    fn order(&self) -> Option<Order> {
        match self.settings.kind {
            MixerKind::Linear => Some(Order::First),
            MixerKind::Hla2 => Some(Order::Second),
            MixerKind::Hla3 => Some(Order::Third),
            MixerKind::Ahla => Some(Order::Asymmetric),
            MixerKind::Softmax => None,
        }
    }

    /// The log gates `[batch or 1, heads, time]` of `time` tokens of the mixer's input `x`
    /// (`None` without decay): data-dependent, or the fixed multi-scale decay.
    fn log_gates(&self, x: &Tensor<3>, time: usize, device: &Device) -> Option<Tensor<3>> {
        let s = &self.settings;
        match (&self.gate, s.decay) {
            (Some(gate), _) => {
                Some(log_sigmoid(linear(gate, x.clone())).swap_dims(1, 2) / GATE_TEMPERATURE)
            }
            (None, DecayKind::Fixed) => Some(
                fixed_log_gates(&multi_scale_decay(s.heads, s.decay_base), time, device)
                    .expect("γ in (0, 1)"),
            ),
            (None, _) => None,
        }
    }

    /// `[batch, time, heads·d_head]` → `[batch, heads, time, d_head]`.
    fn heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, t, width] = x.dims();
        let dh = self.settings.d_head;
        x.reshape([b, t, width / dh, dh]).swap_dims(1, 2)
    }

    /// HLA or linear attention over the feature-mapped q, k.
    fn recur(
        &self,
        x: &Tensor<3>,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        memory: Option<Memory>,
        form: Form,
    ) -> (Tensor<4>, Memory) {
        let s = &self.settings;
        let order = self.order().expect("softmax attention has no recurrence");
        let (q, k) = s.feature_map.apply(q, k);
        let log_g = self.log_gates(x, q.dims()[2], &q.device());
        let input = HlaInput::new(q, k, v, log_g).expect("the mixer builds consistent shapes");
        let state = memory.map(|m| match m {
            Memory::Recurrent(state) => state,
            Memory::Cache { .. } | Memory::Projected(_) => {
                unreachable!("a KV cache passed to a recurrent mixer")
            }
        });
        let (o, state) = hla::forward(order, form, input, state, s.output);
        (o, Memory::Recurrent(state))
    }

    /// Causal softmax attention with RoPE over the cached and new tokens.
    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        memory: Option<Memory>,
    ) -> (Tensor<4>, Memory) {
        let rope = |x: Tensor<4>, start| match &self.rope {
            Some(rope) => rope.apply(x, start),
            None => x,
        };
        let (past_k, past_v) = match memory {
            None => (None, None),
            Some(Memory::Cache { k, v }) => (Some(k), Some(v)),
            Some(Memory::Projected(qkv)) => {
                let widths = [0, 1, 2].map(|_| qkv.dims()[2] / 3);
                let (_, k, v) = split3(qkv, widths);
                (Some(rope(self.heads(k), 0)), Some(self.heads(v)))
            }
            Some(Memory::Recurrent(_)) => unreachable!("a recurrent state passed to softmax"),
        };
        let start = past_k.as_ref().map_or(0, |k| k.dims()[2]);
        let (q, k) = (rope(q, start), rope(k, start));
        let k = past_k.map_or(k.clone(), |past| Tensor::cat(vec![past, k], 2));
        let v = past_v.map_or(v.clone(), |past| Tensor::cat(vec![past, v], 2));
        let o = causal_attention(q, k.clone(), v.clone(), start);
        (o, Memory::Cache { k, v })
    }

    /// RoPE's `(cos, sin)` table for positions `0..time`, `[time, d_head, 2]`; without RoPE
    /// (learned positions) the identity rotation, so the fused kernel serves both.
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    fn rope_table(&self, time: usize, device: &Device) -> Tensor<3> {
        match &self.rope {
            Some(rope) => rope.freq_complex.clone().narrow(0, 0, time),
            None => {
                let part = [time, self.settings.d_head, 1];
                Tensor::cat(
                    vec![Tensor::ones(part, device), Tensor::zeros(part, device)],
                    2,
                )
            }
        }
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
                let (_, state) = self.forward(x, None, Form::Recurrent);
                match state.memory {
                    Memory::Recurrent(state) => state.num_floats(),
                    Memory::Cache { .. } | Memory::Projected(_) => unreachable!(),
                }
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
