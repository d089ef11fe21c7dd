//! Every CPU kernel of the language model's ops against its composed form on every CPU device: outputs and the gradient of
//! every input, on ragged shapes and non-contiguous inputs.

use burn::module::Param;
use burn::nn::RmsNorm;
use burn::prelude::*;
use burn::tensor::Distribution;

use crate::agreement::relative_rms_error;
use crate::backend::takes_cpu_kernel as applies;
use crate::lm::attention::{causal_attention, causal_attention_composed};
use crate::lm::conv::{convolve, convolve_composed};
use crate::lm::head::{head_loss, head_loss_composed, scores, scores_composed};
use crate::lm::linear::{project, project_composed, project_transposed};
use crate::lm::mlp::{swiglu, swiglu_composed};
use crate::lm::norm::rms_norm;
use crate::testing::cpu_devices as devices;

/// Elementwise kernels differ from Burn's ops by rounding only (and `exp` by 2 ulp).
const TOL: f64 = 1e-5;

/// A leaf that requires gradients (on an autodiff device).
fn random<const D: usize>(dims: [usize; D], scale: f64, device: &Device) -> Tensor<D> {
    let x = (Tensor::random(dims, Distribution::Normal(0.0, 1.0), device) * scale).detach();
    if device.is_autodiff() {
        x.require_grad()
    } else {
        x
    }
}

/// `Σ y ⊙ r` for a fixed random `r`, so every output element gets its own cotangent.
fn loss<const D: usize>(y: Tensor<D>, r: &Tensor<D>) -> Tensor<1> {
    (y * r.clone()).sum()
}

fn assert_close<const D: usize>(what: &str, kernel: Tensor<D>, composed: Tensor<D>) {
    let error = relative_rms_error(kernel, composed);
    assert!(error < TOL, "{what}: relative RMS error {error:e}");
}

#[test]
fn swiglu_equals_its_composed_form() {
    for device in devices() {
        let x = random([3, 7, 2 * 37], 3.0, &device);
        assert!(applies(&x), "the CPU kernel must run on {device:?}");
        let r = random([3, 7, 37], 1.0, &device).detach();
        let (kernel, composed) = (swiglu(x.clone()), swiglu_composed(x.clone()));
        assert_close("y", kernel.clone(), composed.clone());
        let (gf, gc) = (loss(kernel, &r).backward(), loss(composed, &r).backward());
        assert_close("∂x", x.grad(&gf).unwrap(), x.grad(&gc).unwrap());
    }
}

#[test]
fn projections_equal_burns_linear() {
    // Products below and above the size that runs on the rayon pool.
    for (batch, time, d_in, d_out) in [(2, 5, 7, 3), (3, 100, 129, 65)] {
        for device in devices() {
            for transposed in [false, true] {
                let x = random([batch, time, d_in], 1.0, &device);
                let dims = if transposed {
                    [d_out, d_in]
                } else {
                    [d_in, d_out]
                };
                let w = random(dims, 0.3, &device);
                let kernel = if transposed {
                    project_transposed(x.clone(), w.clone())
                } else {
                    project(x.clone(), w.clone())
                };
                let composed = project_composed(x.clone(), w.clone(), transposed);
                let r = random([batch, time, d_out], 1.0, &device).detach();
                assert_close("y", kernel.clone(), composed.clone());
                let (gf, gc) = (loss(kernel, &r).backward(), loss(composed, &r).backward());
                assert_close("∂x", x.grad(&gf).unwrap(), x.grad(&gc).unwrap());
                assert_close("∂W", w.grad(&gf).unwrap(), w.grad(&gc).unwrap());
            }
        }
    }
}

#[test]
fn rms_norm_equals_burns() {
    for device in devices() {
        // A transposed input takes the copying path of the host view (one per graph: a
        // backward pass consumes the graph).
        let leaf = random([2, 37, 5], 2.0, &device);
        let x = || leaf.clone().swap_dims(1, 2);
        let gamma = (random([37], 1.0, &device) + 1.0).detach().require_grad();
        let norm = RmsNorm {
            gamma: Param::from_tensor(gamma),
            epsilon: 1e-5,
        };
        let r = random([2, 5, 37], 1.0, &device).detach();
        let (kernel, composed) = (rms_norm(&norm, x()), norm.forward(x()));
        assert_close("y", kernel.clone(), composed.clone());
        let (gf, gc) = (loss(kernel, &r).backward(), loss(composed, &r).backward());
        assert_close("∂x", leaf.grad(&gf).unwrap(), leaf.grad(&gc).unwrap());
        let gamma = &norm.gamma;
        assert_close("∂γ", gamma.grad(&gf).unwrap(), gamma.grad(&gc).unwrap());
    }
}

#[test]
fn short_conv_equals_its_composed_form() {
    // One output token (a decoding step), a ragged length, and sequences longer than a
    // piece; from zeros and from a given history.
    for (batch, time, channels) in [(2, 1, 5), (3, 9, 21), (2, 700, 67)] {
        for device in devices() {
            for given in [false, true] {
                let x = random([batch, time, channels], 1.0, &device);
                let history = random([batch, 3, channels], 1.0, &device);
                let weight = random([4, channels], 0.5, &device);
                let r = random([batch, time, channels], 1.0, &device).detach();
                let before = given.then(|| history.clone());
                let kernel = convolve(x.clone(), before, weight.clone());
                let zeros = Tensor::zeros([batch, 3, channels], &device);
                let window = Tensor::cat(
                    vec![if given { history.clone() } else { zeros }, x.clone()],
                    1,
                );
                let composed = convolve_composed(window, weight.clone());
                assert_close("y", kernel.clone(), composed.clone());
                let (gf, gc) = (loss(kernel, &r).backward(), loss(composed, &r).backward());
                assert_close("∂x", x.grad(&gf).unwrap(), x.grad(&gc).unwrap());
                assert_close("∂W", weight.grad(&gf).unwrap(), weight.grad(&gc).unwrap());
                if given {
                    let (hf, hc) = (history.grad(&gf).unwrap(), history.grad(&gc).unwrap());
                    assert_close("∂history", hf, hc);
                }
            }
        }
    }
}

#[test]
fn attention_equals_burns() {
    // One token, one block, ragged blocks past the first (BLOCK = 128), d ≠ dv; queries
    // from position `start` over a KV cache of `start + T` keys.
    for (time, start, d, dv) in [
        (1, 0, 5, 4),
        (7, 0, 5, 4),
        (130, 0, 8, 3),
        (300, 0, 4, 6),
        (1, 9, 5, 4),
        (3, 140, 4, 4),
        (129, 6, 4, 2),
    ] {
        for device in devices() {
            let (b, h, keys) = (2, 3, start + time);
            let q = random([b, h, time, d], 1.5, &device);
            let k = random([b, h, keys, d], 1.5, &device);
            let v = random([b, h, keys, dv], 1.0, &device);
            let r = random([b, h, time, dv], 1.0, &device).detach();
            let kernel = causal_attention(q.clone(), k.clone(), v.clone(), start);
            let composed = causal_attention_composed(q.clone(), k.clone(), v.clone(), start);
            let case = format!("T={time} start={start}");
            assert_close(&format!("{case} o"), kernel.clone(), composed.clone());
            let (gf, gc) = (loss(kernel, &r).backward(), loss(composed, &r).backward());
            for (name, x) in [("∂q", &q), ("∂k", &k), ("∂v", &v)] {
                assert_close(
                    &format!("{case} {name}"),
                    x.grad(&gf).unwrap(),
                    x.grad(&gc).unwrap(),
                );
            }
        }
    }
}

/// The head and cross-entropy's CPU kernel: the loss, the hits and the gradients of the rows and of
/// the weight, tied (`[vocab, d]`) and untied (`[d, vocab]`), scaled by an upstream gradient;
/// one block and, at a GPT-2 vocabulary, two blocks of rows (the last ragged); and the
/// per-row scores of evaluation.
#[test]
fn head_loss_equals_its_composed_form() {
    for (rows, d, vocab) in [(7, 5, 3), (50, 33, 65), (340, 8, 50257)] {
        for device in devices() {
            for transposed in [false, true] {
                let case = format!("rows {rows} d {d} vocab {vocab} tied {transposed}");
                let x = random([rows, d], 1.0, &device);
                let dims = if transposed { [vocab, d] } else { [d, vocab] };
                let w = random(dims, 0.5, &device);
                // Targets as the rows' own argmax for some rows, so that hits are counted.
                let logits = crate::lm::linear::project_composed(x.clone(), w.clone(), transposed);
                let top: Vec<i64> = logits
                    .argmax(1)
                    .into_data()
                    .convert::<i64>()
                    .try_to_vec()
                    .unwrap();
                let targets: Vec<i64> = (0..rows)
                    .map(|i| {
                        if i % 3 == 0 {
                            top[i]
                        } else {
                            (i * 7919 % vocab) as i64
                        }
                    })
                    .collect();
                let targets =
                    Tensor::<1, Int>::from_data(TensorData::new(targets, [rows]), &device);
                let kernel = head_loss(x.clone(), w.clone(), transposed, targets.clone());
                let composed =
                    head_loss_composed(x.clone(), w.clone(), transposed, targets.clone());
                assert_close(
                    &format!("{case} loss"),
                    kernel.loss.clone(),
                    composed.loss.clone(),
                );
                let hits = |t: Tensor<1>| t.into_scalar::<f32>();
                assert_eq!(hits(kernel.hits), hits(composed.hits), "{case} hits");
                let (gf, gc) = (
                    (kernel.loss * 3.0).backward(),
                    (composed.loss * 3.0).backward(),
                );
                assert_close(
                    &format!("{case} ∂x"),
                    x.grad(&gf).unwrap(),
                    x.grad(&gc).unwrap(),
                );
                assert_close(
                    &format!("{case} ∂W"),
                    w.grad(&gf).unwrap(),
                    w.grad(&gc).unwrap(),
                );
                let kernel = scores(x.clone(), w.clone(), transposed, targets.clone());
                let composed = scores_composed(x.clone(), w.clone(), transposed, targets);
                assert_close(&format!("{case} nll"), kernel.nll, composed.nll);
                let hits = |t: Tensor<1, Bool>| t.into_data().try_to_vec::<bool>().unwrap();
                assert_eq!(hits(kernel.hits), hits(composed.hits), "{case} row hits");
            }
        }
    }
}

#[test]
fn cpu_kernels_run_without_autodiff_and_untracked() {
    for device in devices() {
        let plain = device.clone().inner();
        let x = random([4, 18], 1.0, &plain);
        assert_close("plain", swiglu(x.clone()), swiglu_composed(x));
        // On the autodiff device, inputs that need no gradient.
        let x = random([4, 18], 1.0, &device).detach();
        assert_close("untracked", swiglu(x.clone()), swiglu_composed(x));
    }
}
