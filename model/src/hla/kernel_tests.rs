//! Every order's CPU chunk-parallel kernels, and every order's node, against its composed
//! form: outputs, final states, and the gradients of q, k, v, the initial state and the
//! log gates.

use burn::tensor::{Distribution, TensorData};

use burn::prelude::*;

use super::state::{Operator, with_operator};
use super::{HlaInput, Order, route, state_parts};
use crate::agreement::relative_rms_error;
use crate::hla::{DEFAULT_DECAY_BASE, fixed_log_gates, multi_scale_decay};

const ORDERS: [Order; 4] = [Order::First, Order::Second, Order::Third, Order::Asymmetric];

/// A chunked form under test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Cpu,
    Node,
    Composed,
}

/// The chunked form `kind` of `order` from the state's tensors: `(o, final state's
/// tensors)`.
fn chunked(
    order: Order,
    kind: Kind,
    x: &HlaInput,
    init: Vec<Tensor<4>>,
    c: usize,
) -> (Tensor<4>, Vec<Tensor<4>>) {
    with_operator!(order, O => {
        let state = O::from_tensors(init);
        let (o, state) = match kind {
            Kind::Cpu => route::on_cpu::<O>(x, Some(state), c),
            Kind::Node => {
                let (o, state) = route::on_node::<O>(x, Some(state), c, true);
                (o, state.expect("the final state, asked for"))
            }
            Kind::Composed => O::chunked(x, state, c),
        };
        (o, O::tensors(&state))
    })
}

fn random<const D: usize>(dims: [usize; D], scale: f64, device: &Device) -> Tensor<D> {
    (Tensor::random(dims, Distribution::Normal(0.0, 1.0), device) * scale)
        .detach()
        .require_grad()
}

/// A fixed cotangent for `x`, so that every element of every result gets its own.
fn weight(x: &Tensor<4>, device: &Device) -> Tensor<4> {
    let n: usize = x.dims().iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    Tensor::<1>::from_data(TensorData::new(values, [n]), device).reshape(x.dims())
}

/// The log gates of a case: none, the fixed decay (no gradient), and data-dependent gates
/// per sequence and head or shared by the batch (with a gradient).
fn gates(b: usize, h: usize, time: usize, device: &Device) -> Vec<Option<Tensor<3>>> {
    let fixed = fixed_log_gates(&multi_scale_decay(h, DEFAULT_DECAY_BASE), time, device);
    let learned = |batch| {
        Tensor::random([batch, h, time], Distribution::Uniform(-0.3, 0.0), device).require_grad()
    };
    vec![
        None,
        Some(fixed.unwrap()),
        Some(learned(b)),
        Some(learned(1)),
    ]
}

/// Outputs, final states and the gradients of q, k, v, the initial state and (where they
/// need one) the gates, CPU kernels against composed, for every order: ragged lengths; chunks of
/// 1, 16 and 64; d ≠ dv.
#[test]
fn cpu_chunked_forms_equal_the_composed_ones() {
    agrees_with_composed(Kind::Cpu, &ORDERS);
}

/// The same for every order's node.
#[test]
fn nodes_equal_the_composed_forms() {
    agrees_with_composed(Kind::Node, &ORDERS);
}

/// Every order's node as a training step calls it, from no state and returning none
/// (its scans start from zeros, forward and back), against the composed form from a
/// zero state: the output and the gradients of q, k, v and the gates.
#[test]
fn nodes_without_states_equal_the_composed_forms() {
    let (b, h, d, dv, time, chunk) = (2, 3, 5, 4, 37, 16);
    for device in crate::testing::cpu_devices() {
        for order in ORDERS {
            for (g, log_g) in gates(b, h, time, &device).into_iter().enumerate() {
                let scale = 1.0 / (d as f64).sqrt();
                let q = random([b, h, time, d], scale, &device);
                let k = random([b, h, time, d], scale, &device);
                let v = random([b, h, time, dv], 1.0, &device);
                let input = HlaInput::new(q.clone(), k.clone(), v.clone(), log_g.clone()).unwrap();
                let results: Vec<Vec<Tensor<4>>> = [Kind::Node, Kind::Composed]
                    .into_iter()
                    .map(|kind| {
                        let o = with_operator!(order, O => match kind {
                            Kind::Node => route::on_node::<O>(&input, None, chunk, false).0,
                            _ => O::chunked(&input, super::state::zeros::<O>(&input), chunk).0,
                        });
                        let grads = (o.clone() * weight(&o, &device)).sum().backward();
                        let mut out = vec![o.inner()];
                        out.extend([&q, &k, &v].map(|x| x.grad(&grads).expect("a gradient")));
                        if let Some(g) = log_g.as_ref().filter(|g| g.is_require_grad()) {
                            out.push(g.grad(&grads).expect("a gates' gradient").unsqueeze());
                        }
                        out
                    })
                    .collect();
                for (i, (node, composed)) in results[0].iter().zip(&results[1]).enumerate() {
                    let error = relative_rms_error(node.clone(), composed.clone());
                    assert!(
                        error < 1e-4,
                        "{order:?} gates {g}, result {i}: relative RMS error {error:e}"
                    );
                }
            }
        }
    }
}

fn agrees_with_composed(kind: Kind, orders: &[Order]) {
    let (b, h, d, dv) = (2, 3, 5, 4);
    for device in crate::testing::cpu_devices() {
        for &order in orders {
            for time in [1, 17, 64, 130] {
                for (g, log_g) in gates(b, h, time, &device).into_iter().enumerate() {
                    for chunk in [1, 16, 64] {
                        let scale = 1.0 / (d as f64).sqrt();
                        let (q, k) = (
                            random([b, h, time, d], scale, &device),
                            random([b, h, time, d], scale, &device),
                        );
                        let v = random([b, h, time, dv], 1.0, &device);
                        let init: Vec<Tensor<4>> = state_parts(order, d, dv)
                            .into_iter()
                            .map(|[r, c]| random([b, h, r, c], 0.3, &device))
                            .collect();
                        let input =
                            HlaInput::new(q.clone(), k.clone(), v.clone(), log_g.clone()).unwrap();
                        assert!(crate::backend::takes_cpu_kernel(&input.q));
                        let case = format!("{kind:?} {order:?} T={time} gates {g} chunk {chunk}");
                        let mut results = Vec::new();
                        for kind in [kind, Kind::Composed] {
                            let (o, states) = chunked(order, kind, &input, init.clone(), chunk);
                            let mut loss = (o.clone() * weight(&o, &device)).sum();
                            for s in &states {
                                loss = loss + (s.clone() * weight(s, &device)).sum();
                            }
                            let grads = loss.backward();
                            let mut out = vec![o.inner()];
                            out.extend(states.iter().map(|s| s.clone().inner()));
                            for x in [&q, &k, &v].into_iter().chain(&init) {
                                out.push(x.grad(&grads).expect("a gradient"));
                            }
                            if let Some(g) = log_g.as_ref().filter(|g| g.is_require_grad()) {
                                out.push(g.grad(&grads).expect("a gates' gradient").unsqueeze());
                            }
                            results.push(out);
                        }
                        for (i, (tested, composed)) in
                            results[0].iter().zip(&results[1]).enumerate()
                        {
                            let error = relative_rms_error(tested.clone(), composed.clone());
                            assert!(
                                error < 1e-4,
                                "{case}, result {i}: relative RMS error {error:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}
