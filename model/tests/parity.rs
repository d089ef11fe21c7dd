//! reference == recurrent == chunked: outputs, final states and gradients, for every
//! operator and option, on every compiled CPU device.

mod common;

use burn::prelude::*;
use common::{Case, Gates, Worst, devices, input};
use hla_model::hla::{Form, HlaState, Order, Output, forward};

const ORDERS: [Order; 4] = [Order::First, Order::Second, Order::Third, Order::Asymmetric];
const TIMES: [usize; 6] = [1, 2, 63, 64, 65, 257];
const CHUNKS: [usize; 3] = [1, 16, 64];

/// The chunked forms: one pass at each chunk size, and passes of 32 tokens (a segment of
/// 40 rounds down to two chunks of 16), so 63, 65 and 257 tokens end in a ragged pass.
fn chunked_forms() -> Vec<Form> {
    let segmented = Form::Segmented {
        chunk: 16,
        segment: 40,
    };
    CHUNKS
        .map(Form::Chunked)
        .into_iter()
        .chain([segmented])
        .collect()
}

/// Each option on and off, singly and combined, for one operator.
fn option_sets(order: Order) -> Vec<Case> {
    let base = Case::new(order);
    let normalized = Output::Normalized { eps: 1e-6 };
    vec![
        base,
        Case {
            gates: Gates::Fixed,
            ..base
        },
        Case {
            gates: Gates::Data { lo: 0.85 },
            ..base
        },
        Case {
            output: normalized,
            ..base
        },
        Case {
            shared_keys: true,
            ..base
        },
        Case {
            shared_keys: true,
            shared_gates: true,
            gates: Gates::Data { lo: 0.85 },
            ..base
        },
        Case {
            shared_keys: true,
            gates: Gates::Fixed,
            ..base
        },
        Case {
            init_state: true,
            ..base
        },
        Case {
            gates: Gates::Data { lo: 0.85 },
            output: normalized,
            init_state: true,
            ..base
        },
    ]
}

fn run(case: &Case, form: Form, device: &Device) -> (Tensor<4>, HlaState) {
    let (qkv, log_g, init) = case.tensors(device);
    let state = init.map(|t| HlaState::from_tensors(case.order, t));
    forward(case.order, form, input(&qkv, &log_g), state, case.output)
}

fn compare_states(worst: &mut Worst, name: &str, got: &HlaState, want: &HlaState, case: &Case) {
    for (i, (g, w)) in got.tensors().iter().zip(want.tensors()).enumerate() {
        worst.check(&format!("{name} state[{i}]"), g, &w, case);
    }
}

#[test]
fn outputs_and_states_agree_across_forms() {
    for device in devices() {
        let mut worst = Worst::default();
        for order in ORDERS {
            for base in option_sets(order) {
                for time in TIMES {
                    let case = Case { time, ..base };
                    let (o_ref, s_ref) = run(&case, Form::Reference, &device);
                    let (o_rec, s_rec) = run(&case, Form::Recurrent, &device);
                    let tag = format!("{order:?} recurrent/reference");
                    worst.check(&tag, &o_rec, &o_ref, &case);
                    compare_states(&mut worst, &tag, &s_rec, &s_ref, &case);
                    for form in chunked_forms() {
                        let (o_chk, s_chk) = run(&case, form, &device);
                        let tag = format!("{order:?} {form:?}/reference");
                        worst.check(&tag, &o_chk, &o_ref, &case);
                        compare_states(&mut worst, &tag, &s_chk, &s_ref, &case);
                    }
                }
            }
        }
        worst.report(&format!("values on {device:?}"));
    }
}

/// Strong gates (down to 0.3) over a long sequence: the decay factors span many orders
/// of magnitude, and every exponent must stay a difference.
#[test]
fn strong_gates_stay_exact() {
    for device in devices() {
        let mut worst = Worst::default();
        for order in ORDERS {
            let case = Case {
                time: 257,
                gates: Gates::Data { lo: 0.3 },
                init_state: true,
                ..Case::new(order)
            };
            let (o_ref, s_ref) = run(&case, Form::Reference, &device);
            // Chunks of one token: 258 elements in the chunk-axis scan, two levels of blocks.
            for form in [Form::Recurrent, Form::Chunked(64), Form::Chunked(1)] {
                let (o, s) = run(&case, form, &device);
                let tag = format!("{order:?} {form:?}/reference");
                worst.check(&tag, &o, &o_ref, &case);
                compare_states(&mut worst, &tag, &s, &s_ref, &case);
            }
        }
        worst.report(&format!("strong gates on {device:?}"));
    }
}

/// Gradients of `Σ o·r₀ + Σ_i Σ state_i·r_i` (random r) with respect to q, k, v, the log
/// gates and every initial state tensor.
fn gradients(case: &Case, form: Form, device: &Device) -> Vec<(String, Tensor<4>)> {
    let ad = device.clone().autodiff();
    let (qkv, log_g, init) = case.tensors(&ad);
    let qkv: Vec<Tensor<4>> = qkv.into_iter().map(Tensor::require_grad).collect();
    let log_g = log_g.map(Tensor::require_grad);
    let init: Vec<Tensor<4>> = init
        .expect("gradient cases carry an initial state")
        .into_iter()
        .map(Tensor::require_grad)
        .collect();
    let state = HlaState::from_tensors(case.order, init.clone());
    let (o, state) = forward(
        case.order,
        form,
        input(&qkv, &log_g),
        Some(state),
        case.output,
    );

    let mut rng = common::Rng::new(99);
    let mut loss = (o.clone() * rng.tensor(o.dims(), 1.0, &ad)).sum();
    for s in state.tensors() {
        loss = loss + (s.clone() * rng.tensor(s.dims(), 1.0, &ad)).sum();
    }
    let grads = loss.backward();
    let mut out: Vec<(String, Tensor<4>)> = ["q", "k", "v"]
        .iter()
        .zip(&qkv)
        .map(|(name, x)| (name.to_string(), x.grad(&grads).expect("gradient")))
        .collect();
    if let Some(g) = &log_g {
        out.push((
            "log_g".into(),
            g.grad(&grads).expect("gradient").unsqueeze(),
        ));
    }
    for (i, s) in init.iter().enumerate() {
        out.push((format!("state[{i}]"), s.grad(&grads).expect("gradient")));
    }
    out
}

#[test]
fn gradients_agree_across_forms() {
    for device in devices() {
        let mut worst = Worst::default();
        for order in ORDERS {
            for base in option_sets(order) {
                for time in TIMES {
                    let case = Case {
                        time,
                        init_state: true,
                        ..base
                    };
                    let want = gradients(&case, Form::Reference, &device);
                    for form in std::iter::once(Form::Recurrent).chain(chunked_forms()) {
                        for ((name, got), (_, want)) in
                            gradients(&case, form, &device).iter().zip(&want)
                        {
                            worst.check(&format!("{order:?} {form:?} d{name}"), got, want, &case);
                        }
                    }
                }
            }
        }
        worst.report(&format!("gradients on {device:?}"));
    }
}

/// Chunked over [0, t), then chunked or recurrent over [t, T) from the returned state,
/// equals one call over [0, T).
#[test]
fn split_and_resume() {
    for device in devices() {
        let mut worst = Worst::default();
        for order in ORDERS {
            let case = Case {
                time: 100,
                gates: Gates::Data { lo: 0.85 },
                output: Output::Normalized { eps: 1e-6 },
                init_state: true,
                ..Case::new(order)
            };
            let (qkv, log_g, init) = case.tensors(&device);
            let init = HlaState::from_tensors(order, init.unwrap());
            let whole = input(&qkv, &log_g);
            let (o_all, s_all) = forward(
                order,
                Form::Chunked(16),
                whole.clone(),
                Some(init.clone()),
                case.output,
            );
            for split in [1, 37, 64, 99] {
                let part = |from: usize, to: usize| {
                    let qkv: Vec<Tensor<4>> = qkv
                        .iter()
                        .map(|x| x.clone().slice(s![.., .., from..to, ..]))
                        .collect();
                    let g = log_g.clone().map(|g| g.slice(s![.., .., from..to]));
                    input(&qkv, &g)
                };
                let (o_head, s_head) = forward(
                    order,
                    Form::Chunked(16),
                    part(0, split),
                    Some(init.clone()),
                    case.output,
                );
                for form in [Form::Chunked(16), Form::Recurrent] {
                    let (o_tail, s_tail) = forward(
                        order,
                        form,
                        part(split, 100),
                        Some(s_head.clone()),
                        case.output,
                    );
                    let o = Tensor::cat(vec![o_head.clone(), o_tail], 2);
                    let tag = format!("{order:?} split+{form:?}/one call");
                    worst.check(&tag, &o, &o_all, &split);
                    compare_states(&mut worst, &tag, &s_tail, &s_all, &case);
                }
            }
        }
        worst.report(&format!("split and resume on {device:?}"));
    }
}

/// A step with `time = 1` is the recurrence: stepping token by token equals one call.
#[test]
fn step_matches_sequence() {
    for device in devices() {
        for order in ORDERS {
            let case = Case {
                time: 9,
                gates: Gates::Fixed,
                ..Case::new(order)
            };
            let (qkv, log_g, _) = case.tensors(&device);
            let (o_all, _) = forward(
                order,
                Form::Chunked(4),
                input(&qkv, &log_g),
                None,
                case.output,
            );
            let mut state = None;
            let mut outs = Vec::new();
            for t in 0..case.time {
                let qkv: Vec<Tensor<4>> = qkv
                    .iter()
                    .map(|x| x.clone().slice(s![.., .., t..=t, ..]))
                    .collect();
                let g = log_g.clone().map(|g| g.slice(s![.., .., t..=t]));
                let token = input(&qkv, &g);
                let state_in = state
                    .take()
                    .unwrap_or_else(|| HlaState::zeros(order, &token, case.output));
                let (o, next) = hla_model::hla::step(order, token, state_in, case.output);
                outs.push(o);
                state = Some(next);
            }
            let err = common::rel_rms(&Tensor::cat(outs, 2), &o_all);
            assert!(err <= common::TOL, "{order:?}: step vs chunked {err:.3e}");
        }
    }
}
