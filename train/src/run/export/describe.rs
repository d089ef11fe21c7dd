//! `config.json` of an export: every fact a re-implementation of the forward pass needs,
//! as data (names of tensors, shapes, epsilons, formulas, the decay of every head), so
//! that `train/python/hla_reference.py` or anyone else runs the model without our code.
//! The format is written down in `docs/export.md`.

use burn::nn::{LayerNormConfig, RmsNormConfig};
use hla_data::config::Task;
use hla_model::hla::multi_scale_decay;
use hla_model::lm::{
    DENOMINATOR_EPS, DecayKind, FeatureMap, GATE_TEMPERATURE, L2_EPS, LmConfig, MixerKind, MlpKind,
    NormKind, Positions,
};
use hla_model::optim::CLIP_EPS;
use serde_json::{Value, json};

use crate::run::config::RunConfig;

/// The version of the format; a change that breaks readers raises it. Version 2 added
/// hybrid stacks: `architecture.mixers`, each layer's mixer.
pub const VERSION: u32 = 2;

/// The version of an export of a uniform stack: what version 1 readers run, since its
/// `architecture.mixer` describes every layer as before.
const UNIFORM_VERSION: u32 = 1;

/// `config.json` for a run's model with `vocab_size` tokens.
pub fn describe(config: &RunConfig, vocab_size: usize) -> anyhow::Result<Value> {
    let lm = config.lm_config(vocab_size);
    Ok(json!({
        "format": "hla-export",
        "version": if lm.is_hybrid() { VERSION } else { UNIFORM_VERSION },
        "vocab_size": vocab_size,
        "model": LmConfig::serialize(&config.model, serde_json::value::Serializer)?,
        "lm_config": serde_json::to_value(&lm)?,
        "architecture": architecture(&lm),
        "evaluation": evaluation(config)?,
        "training": training(config),
    }))
}

/// How the run trained, as far as it tells what the weights are: the clipping of its
/// gradients.
fn training(config: &RunConfig) -> Value {
    let t = &config.train;
    json!({
        "grad_clip": t.grad_clip,
        "clip": t.clip.name(),
        "clip_formula": match (t.grad_clip > 0.0, t.clip.name()) {
            (false, _) => "none: grad_clip = 0".to_string(),
            (true, "global") => format!(
                "global norm, as torch.nn.utils.clip_grad_norm_: total = sqrt(sum over every \
                 parameter of ||g||^2); if total > grad_clip every g *= grad_clip / (total + \
                 {CLIP_EPS:e})"
            ),
            (true, _) => "each parameter on its own: g *= min(1, grad_clip / (||g|| + the \
                          smallest positive float32))"
                .to_string(),
        },
    })
}

fn architecture(c: &LmConfig) -> Value {
    json!({
        "dtype": "float32",
        "linear": "every weight matrix is stored [in, out] and applied as y = x @ W \
                   (transpose it for torch.nn.Linear); no layer has a bias",
        "embedding": { "weight": "embedding.weight", "shape": [c.vocab_size, c.d_model] },
        "positions": positions(c),
        "layers": c.n_layers,
        "block": if c.mlp {
            "x = x + mixer(mixer_norm(x)); x = x + mlp(mlp_norm(x)); tensor names: replace {i} \
             by the layer, 0 first"
        } else {
            "x = x + mixer(mixer_norm(x)) (no MLP); tensor names: replace {i} by the layer, 0 \
             first"
        },
        "norm": norm(c.norm),
        "mixer": (!c.is_hybrid()).then(|| mixer(&c.for_mixer(c.mixers()[0]))),
        "mixers": c.mixers().into_iter().map(|kind| mixer(&c.for_mixer(kind))).collect::<Vec<_>>(),
        "mlp": c.mlp.then(|| mlp(c)),
        "final_norm": norm_weight(c.norm, ""),
        "head": if c.tie_embeddings {
            json!({ "tied": true, "formula": "logits = final_norm(x) @ embedding.weight^T, \
                     no scale, no bias" })
        } else {
            json!({ "tied": false, "weight": "head.weight", "shape": [c.d_model, c.vocab_size],
                    "formula": "logits = final_norm(x) @ head.weight, no bias" })
        },
    })
}

fn positions(c: &LmConfig) -> Value {
    match c.positions {
        Positions::Rope => json!({
            "kind": "rope",
            "note": "rotary positions inside softmax attention only (see mixer.rope); HLA and \
                     linear attention get no position signal but their recurrence and the \
                     short convolution",
        }),
        Positions::Learned => json!({
            "kind": "learned",
            "weight": "positions.weight",
            "shape": [c.max_seq_len, c.d_model],
            "formula": "x_t = embedding.weight[token_t] + positions.weight[t], t counted from 0 \
                        at the start of each sequence; at most max_seq_len tokens",
        }),
    }
}

/// The pre-norms' kind, epsilon and formula.
fn norm(kind: NormKind) -> Value {
    match kind {
        NormKind::Rms => json!({
            "kind": "rms",
            "epsilon": RmsNormConfig::new(1).epsilon,
            "formula": "y = x / sqrt(mean(x^2) + epsilon) * gamma, over the last axis",
        }),
        NormKind::Layer => json!({
            "kind": "layer",
            "epsilon": LayerNormConfig::new(1).epsilon,
            "formula": "y = (x - mean(x)) / sqrt(var(x) + epsilon) * gamma, over the last \
                        axis, var the biased (population) variance; no bias",
        }),
    }
}

/// The name of a pre-norm's gain: `prefix` + `norm` (RMSNorm) or `layer_norm`.
fn norm_weight(kind: NormKind, prefix: &str) -> Value {
    let field = match kind {
        NormKind::Rms => "norm",
        NormKind::Layer => "layer_norm",
    };
    json!({ "gamma": format!("{prefix}{field}.gamma") })
}

fn mixer(c: &LmConfig) -> Value {
    let (d, heads) = (c.d_model, c.n_heads);
    let d_head = d / heads;
    let recurrent = c.mixer != MixerKind::Softmax;
    let shared = c.shared_keys && recurrent;
    let d_k = if shared { d_head } else { d };
    let p = "blocks.{i}.mixer.";
    let mut out = json!({
        "kind": c.mixer.name(),
        "norm": norm_weight(c.norm, "blocks.{i}.mixer_"),
        "heads": heads,
        "d_head": d_head,
        "q": { "weight": format!("{p}q.weight"), "shape": [d, d] },
        "k": { "weight": format!("{p}k.weight"), "shape": [d, d_k] },
        "v": { "weight": format!("{p}v.weight"), "shape": [d, d] },
        "head_layout": if shared {
            "head h owns columns [h*d_head, (h+1)*d_head) of q and v and of the output before \
             `out`; k has one head (d_head columns) shared by every head"
        } else {
            "head h owns columns [h*d_head, (h+1)*d_head) of q, k and v and of the output \
             before `out`"
        },
        "short_conv": (c.short_conv > 0).then(|| json!({
            "weight": format!("{p}conv.weight"),
            "shape": [c.short_conv, 2 * d + d_k],
            "channels": "the projections side by side, [q | k | v], before the heads split",
            "formula": "y_t = silu(sum_j W[j] * x_{t-(kernel-1)+j}) per channel, zeros before \
                        the first token of a sequence: row kernel-1 weighs the current token",
        })),
        "out": {
            "weight": format!("{p}out.weight"),
            "shape": [d, d],
            "formula": "y = o @ W, o the heads' outputs side by side",
        },
        "output_gate": c.output_gate.then(|| json!({
            "weight": format!("{p}out_gate.weight"),
            "shape": [d, d],
            "formula": "o = o * silu(x @ W) before `out`, x the mixer's input (after its norm)",
        })),
    });
    let extra = if recurrent {
        recurrence(c, d_head)
    } else {
        attention(d_head, c.positions == Positions::Rope)
    };
    if let (Some(out), Value::Object(extra)) = (out.as_object_mut(), extra) {
        out.extend(extra);
    }
    out
}

/// Softmax attention, with RoPE unless the positions are learned.
fn attention(d_head: usize, rope: bool) -> Value {
    json!({
        "order": "project, short_conv, split into heads, rope on q and k (if any), \
                  attention, out",
        "attention": "o_t = sum_{j<=t} softmax_j(q_t . k_j / sqrt(d_head)) v_j per head",
        "rope": rope.then(|| json!({
            "base": 10000.0,
            "dims": d_head,
            "formula": "pairs (2i, 2i+1) of a head at position t turn by the angle \
                        t * base^(-2i/d_head): (a, b) -> (a cos - b sin, a sin + b cos)",
        })),
    })
}

fn recurrence(c: &LmConfig, d_head: usize) -> Value {
    let feature_map = c.resolved_feature_map();
    let map_formula = match feature_map {
        FeatureMap::L2 => format!("x / max(||x||_2, {L2_EPS:e}) for q and k"),
        FeatureMap::Scale => "q / sqrt(d_head); k unchanged".into(),
        FeatureMap::EluPlusOne => "elu(x) + 1 for q and k".into(),
        FeatureMap::Identity => "q and k unchanged".into(),
    };
    let rule = match c.mixer {
        MixerKind::Linear => "S_t = g_t S_{t-1} + k_t v_t^T; o_t = q_t^T S_t",
        MixerKind::Hla2 => {
            "S_t = g_t S_{t-1} + k_t k_t^T; Z_t = g_t^2 Z_{t-1} + (S_t q_t) v_t^T; \
             o_t = q_t^T Z_t"
        }
        MixerKind::Hla3 => {
            "S_t = g_t S_{t-1} + k_t k_t^T; P_t = g_t P_{t-1} + k_t v_t^T; \
             Y_t = g_t^3 Y_{t-1} + (S_t q_t)(q_t^T P_t); o_t = q_t^T Y_t"
        }
        MixerKind::Ahla => {
            "P_t = g_t P_{t-1} + k_t v_t^T; E_t = g_t E_{t-1} + k_t (q_t^T P_t); \
             o_t = q_t^T E_t"
        }
        MixerKind::Softmax => unreachable!("softmax attention has no recurrence"),
    };
    let p = "blocks.{i}.mixer.";
    json!({
        "order": "project, short_conv, split into heads, feature_map, recurrence \
                  (then the denominator), output_norm, output_gate, out",
        "feature_map": {
            "kind": feature_map.name(),
            "epsilon": (feature_map == FeatureMap::L2).then_some(L2_EPS),
            "axis": "each head's d_head features, after the short convolution",
            "formula": map_formula,
        },
        "recurrence": {
            "rule": rule,
            "state": "per sequence and head, zero before the first token; q_t, k_t, v_t are \
                      column vectors of one head",
        },
        "decay": match c.decay {
            DecayKind::None => json!({ "kind": "none", "formula": "g_t = 1" }),
            DecayKind::Fixed => json!({
                "kind": "fixed",
                "gamma": multi_scale_decay(c.n_heads, c.decay_base),
                "formula": format!(
                    "g_t = gamma[h] for head h, gamma[h] = 1 - 2^(-{}-h)", c.decay_base
                ),
            }),
            DecayKind::Gated => json!({
                "kind": "gated",
                "weight": format!("{p}gate.weight"),
                "shape": [c.d_model, c.n_heads],
                "temperature": GATE_TEMPERATURE,
                "formula": format!(
                    "log g_t = log_sigmoid(x_t @ W)[h] / {GATE_TEMPERATURE} for head h, x_t \
                     the mixer's input (after its norm)"
                ),
            }),
        },
        "denominator": c.resolved_normalize().then(|| json!({
            "epsilon": DENOMINATOR_EPS,
            "formula": format!(
                "o_t = num_t / (sign(den_t) * max(|den_t|, {DENOMINATOR_EPS:e})), sign(0) = +1; \
                 den_t: the same recurrence with v_t = 1"
            ),
        })),
        "output_norm": c.resolved_output_norm().then(|| json!({
            "kind": "rms",
            "gamma": format!("{p}out_norm.gamma"),
            "shape": [d_head],
            "epsilon": RmsNormConfig::new(1).epsilon,
            "formula": "RMSNorm of each head's output over its d_head features, one gamma \
                        shared by the heads",
        })),
    })
}

fn mlp(c: &LmConfig) -> Value {
    let (d, d_ff) = (c.d_model, c.d_ff());
    let p = "blocks.{i}.mlp.";
    let body = match c.mlp_kind {
        MlpKind::Swiglu => json!({
            "kind": "swiglu",
            "w1": { "weight": format!("{p}up.linear_inner.weight"), "shape": [d, d_ff] },
            "w2": { "weight": format!("{p}up.linear_outer.weight"), "shape": [d, d_ff] },
            "formula": "y = (silu(x @ w1) * (x @ w2)) @ down",
        }),
        MlpKind::Gelu => json!({
            "kind": "gelu",
            "w": { "weight": format!("{p}fc.weight"), "shape": [d, d_ff] },
            "formula": "y = gelu(x @ w) @ down, gelu(x) = x/2 (1 + erf(x / sqrt(2))) (exact, not \
                        the tanh form)",
        }),
    };
    let mut out = json!({
        "norm": norm_weight(c.norm, p),
        "down": { "weight": format!("{p}down.weight"), "shape": [d_ff, d] },
    });
    if let (Some(out), Value::Object(body)) = (out.as_object_mut(), body) {
        out.extend(body);
    }
    out
}

fn evaluation(config: &RunConfig) -> anyhow::Result<Value> {
    Ok(match config.data.task()? {
        Task::Text { .. } => json!({
            "task": "text",
            "loss": "mean cross-entropy (nats) over every scored token of the validation split",
            "split": "the validation split is tokens[floor(n * train_fraction):] of the \
                      corpus's n tokens",
            "train_fraction": config.data.train_fraction,
            "context": config.train.context,
            "windows": "windows of context + 1 tokens starting every `context` tokens of the \
                        split (the last one shorter), each run from an empty state: inputs \
                        window[:-1], targets window[1:]",
        }),
        Task::Mqar(_) => json!({
            "task": "mqar",
            "loss": "mean cross-entropy over the answer positions of the generated MQAR test \
                     set (hla eval regenerates it from the run's config)",
        }),
    })
}
