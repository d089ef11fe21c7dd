//! The HLA forms on the wgpu device against ndarray, and the GPU kernels and the nodes
//! against their composed forms.

use burn::prelude::*;
use hla_model::backend::Kernels;
use hla_model::hla::{
    Form, HlaInput, HlaState, Order, ahla, first, forward, output, second, third,
};

use crate::common::{Case, Gates, Rng, input, rel_rms};
use crate::{
    TOL, cap_grid, cap_rows, cpu, emulate_tensor_cores, gpu, kernels, launched,
    plan_multiprocessors, to_cpu,
};

/// Everything one call computes, by name: the output, the final state, and the gradients
/// of `Σ o·r₀ + Σ_i Σ state_i·r_i` (random r) with respect to q, k, v and the log gates.
fn results(case: &Case, form: Form, device: &Device) -> Vec<(String, Tensor<4>)> {
    let ad = device.clone().autodiff();
    let (qkv, log_g, init) = case.tensors(&ad);
    let qkv: Vec<Tensor<4>> = qkv.into_iter().map(Tensor::require_grad).collect();
    let log_g = log_g.map(Tensor::require_grad);
    let state = init.map(|t| HlaState::from_tensors(case.order, t));
    let (o, state) = forward(case.order, form, input(&qkv, &log_g), state, case.output);

    let mut rng = Rng::new(99);
    let mut loss = (o.clone() * rng.tensor(o.dims(), 1.0, &ad)).sum();
    for s in state.tensors() {
        loss = loss + (s.clone() * rng.tensor(s.dims(), 1.0, &ad)).sum();
    }
    let grads = loss.backward();

    let mut out = vec![("o".to_string(), to_cpu(o))];
    for (i, s) in state.tensors().into_iter().enumerate() {
        out.push((format!("state[{i}]"), to_cpu(s)));
    }
    for (name, x) in ["q", "k", "v"].iter().zip(&qkv) {
        out.push((
            format!("d{name}"),
            to_cpu(x.grad(&grads).expect("gradient")),
        ));
    }
    if let Some(g) = &log_g {
        let grad = g.grad(&grads).expect("gradient").unsqueeze();
        out.push(("dlog_g".into(), to_cpu(grad)));
    }
    out
}

/// Every order's forms on the GPU, by default (the chunked form as the node) and composed,
/// against the CPU's.
#[test]
fn hla_forms_match_the_cpu() {
    let _switch = kernels(Kernels::default());
    let (gpu, cpu) = (gpu(), cpu());
    let mut worst: f64 = 0.0;
    for route in [Kernels::default(), Kernels::None] {
        hla_model::backend::set_kernels(route);
        for order in [Order::First, Order::Second, Order::Third, Order::Asymmetric] {
            for gates in [Gates::None, Gates::Data { lo: 0.85 }] {
                // 17 tokens in chunks of 8: two full chunks and a ragged one.
                let case = Case {
                    gates,
                    init_state: true,
                    ..Case::new(order)
                };
                for form in [Form::Recurrent, Form::Chunked(8)] {
                    let want = results(&case, form, &cpu);
                    let got = results(&case, form, &gpu);
                    assert_eq!(got.len(), want.len());
                    for ((name, g), (_, w)) in got.iter().zip(&want) {
                        let err = rel_rms(g, w);
                        assert!(
                            err <= TOL,
                            "{route:?} {order:?} {form:?} {name}: wgpu vs ndarray {err:.3e} for \
                             {case:?}"
                        );
                        worst = worst.max(err);
                    }
                }
            }
        }
    }
    eprintln!("HLA on {gpu:?} vs {cpu:?}: largest relative RMS error {worst:.2e}");
}

/// The composed chunked form of `order`: `(o, final state)`.
fn composed(order: Order, x: &HlaInput, state: HlaState, c: usize) -> (Tensor<4>, HlaState) {
    match (order, state) {
        (Order::First, HlaState::First(s)) => {
            let (o, s) = first::chunked(x, s, c);
            (o, HlaState::First(s))
        }
        (Order::Second, HlaState::Second(s)) => {
            let (o, s) = second::chunked(x, s, c);
            (o, HlaState::Second(s))
        }
        (Order::Third, HlaState::Third(s)) => {
            let (o, s) = third::chunked(x, s, c);
            (o, HlaState::Third(s))
        }
        (Order::Asymmetric, HlaState::Asymmetric(s)) => {
            let (o, s) = ahla::chunked(x, s, c);
            (o, HlaState::Asymmetric(s))
        }
        (order, _) => unreachable!("a state of another order than {order:?}"),
    }
}

/// The GPU kernels of the chunked forms (every order; the fixed decay or none)
/// against their composed forms on the same device: outputs, final states and the
/// gradients of q, k, v and the initial state within 1e-4 (relative RMS), for ragged
/// lengths and an initial state.
#[test]
fn gpu_kernels_match_their_composed_forms() {
    let _switch = kernels(Kernels::All);
    let mut worst: f64 = 0.0;
    for order in [Order::First, Order::Second, Order::Third, Order::Asymmetric] {
        for gates in [Gates::None, Gates::Fixed] {
            for (time, chunk, dv) in [(1, 8, 4), (17, 8, 4), (40, 16, 6)] {
                let case = Case {
                    gates,
                    time,
                    dv,
                    init_state: true,
                    ..Case::new(order)
                };
                worst = worst.max(kernel_vs_composed(&case, chunk));
            }
        }
    }
    eprintln!("GPU kernels vs composed forms: largest relative RMS error {worst:.2e}");
}

/// The nodes (every order's chunked form as one autodiff node of Burn's ops) against their
/// composed forms on the GPU device, through Burn's fusion: as
/// [`gpu_kernels_match_their_composed_forms`], data-dependent gates with their gradient
/// included. The nodes' math is the CPU tests' (`hla::kernel_tests`, every gate and
/// length); here each order takes the gated ragged case, hla2 a length of one and the
/// fixed decay over several chunks too, every other order a case without the gates'
/// gradient (each shape costs shader compiles), and two calls as a training step makes
/// them (no initial state, no final state returned). Every order's node runs its fused
/// forward and backward kernels in every case; the gated cases with two tokens a unit
/// (four units a chunk of 8, where lavapipe's budget gives one unit all 8), so that the
/// backward's parts of the gates' gradient are summed over units as on a GPU.
#[test]
fn nodes_match_their_composed_forms() {
    let _switch = kernels(Kernels::Nodes);
    let mut worst: f64 = 0.0;
    let orders = [Order::First, Order::Second, Order::Third, Order::Asymmetric];
    let mut cases = orders
        .map(|order| (order, Gates::Data { lo: 0.85 }, (17, 8, 4)))
        .to_vec();
    cases.push((Order::Second, Gates::None, (1, 8, 4)));
    cases.push((Order::Second, Gates::Fixed, (40, 16, 6)));
    cases.push((Order::First, Gates::Fixed, (17, 8, 4)));
    cases.push((Order::Third, Gates::None, (17, 8, 4)));
    cases.push((Order::Asymmetric, Gates::Fixed, (17, 8, 4)));
    // From no state and returning none (a training step's call): the scans from zeros.
    let no_state = cases.len();
    cases.push((Order::Second, Gates::Fixed, (40, 16, 6)));
    cases.push((Order::Third, Gates::Data { lo: 0.85 }, (17, 8, 4)));
    for (i, (order, gates, (time, chunk, dv))) in cases.into_iter().enumerate() {
        let case = Case {
            gates,
            time,
            dv,
            init_state: i < no_state,
            ..Case::new(order)
        };
        let _rows = matches!(gates, Gates::Data { .. }).then(|| cap_rows(2));
        let (err, names) = launched(|| kernel_vs_composed(&case, chunk));
        // The backward's moment products (with its reads' terms of ∂Q and the gates'
        // gradient; its passes back are pass kernels too).
        let mut fused = vec!["output_kernel", "pass_kernel", "grads_kernel"];
        if order == Order::Second {
            fused.push("moments_kernel");
        }
        for name in fused {
            assert!(
                names.iter().any(|n| n.contains(name)),
                "{order:?}'s node ran its {name} ({gates:?}, T={time}): {names:?}"
            );
        }
        worst = worst.max(err);
    }
    eprintln!("Nodes vs composed forms: largest relative RMS error {worst:.2e}");
}

/// The nodes with their output step on tensor-core tiles, emulated on lavapipe (each unit
/// computes the accumulator values its lane would hold), against their composed forms as
/// [`nodes_match_their_composed_forms`]: every order (p = 1, 2, 3, the third order's
/// transposed read, hla2's moments as the same tiles), with the fixed decay and with
/// data-dependent gates, widths and chunks of whole fragments (16) over a ragged last
/// chunk; the passes over the chunks (forward and back) and the backward's moment
/// products run as tiles too (with the data-dependent gates' gradient), and the
/// register-tile output, moments, moment-gradient and pass kernels never run.
#[test]
fn nodes_match_their_composed_forms_on_tensor_core_tiles() {
    let _switch = kernels(Kernels::Nodes);
    let _tiles = emulate_tensor_cores();
    let mut worst: f64 = 0.0;
    for order in [Order::First, Order::Second, Order::Third, Order::Asymmetric] {
        for gates in [Gates::Fixed, Gates::Data { lo: 0.85 }] {
            let case = Case {
                gates,
                time: 40,
                d: 16,
                dv: 32,
                heads: 2,
                init_state: true,
                ..Case::new(order)
            };
            let (err, names) = launched(|| kernel_vs_composed(&case, 16));
            assert!(
                names.iter().any(|n| n.contains("output_tiles_kernel")),
                "{order:?} {gates:?}: the tiles: {names:?}"
            );
            assert!(
                names.iter().any(|n| n.contains("grads_tiles_kernel")),
                "{order:?} {gates:?}: the backward's tiles: {names:?}"
            );
            assert!(
                names.iter().any(|n| n.contains("pass_tiles_kernel")),
                "{order:?} {gates:?}: the passes' tiles: {names:?}"
            );
            let register_tiles = [
                "output_kernel",
                "moments_kernel",
                "grads_kernel",
                "pass_kernel",
            ];
            for register_tiles in register_tiles {
                assert!(
                    !names.iter().any(|n| n.contains(register_tiles)),
                    "{order:?} {gates:?}: {register_tiles} ran: {names:?}"
                );
            }
            worst = worst.max(err);
        }
    }
    eprintln!(
        "Nodes on tensor-core tiles vs composed forms: largest relative RMS error {worst:.2e}"
    );
}

/// On a GPU whose multiprocessors a pass's cubes would not fill (6 sequences of small
/// states, a cube each), the nodes run the composed update and the scan kernel in place
/// of their pass kernels, forward and back, and still give their composed forms' numbers:
/// every order, from an initial state with the fixed decay or from none with
/// data-dependent gates. With as many multiprocessors as cubes, the pass kernels run.
#[test]
fn nodes_split_their_passes_where_those_would_not_fill_the_gpu() {
    let _switch = kernels(Kernels::Nodes);
    let mut worst: f64 = 0.0;
    let data = Gates::Data { lo: 0.85 };
    let cases = [
        (Order::First, Gates::Fixed, true),
        (Order::Second, data, false),
        (Order::Third, Gates::Fixed, true),
        (Order::Asymmetric, data, false),
        (Order::Second, Gates::Fixed, true),
    ];
    for (i, (order, gates, init_state)) in cases.into_iter().enumerate() {
        let case = Case {
            gates,
            init_state,
            ..Case::new(order)
        };
        let cubes = case.batch * case.heads;
        let split = i + 1 < cases.len();
        let _gpu = plan_multiprocessors(if split { cubes + 1 } else { cubes });
        let (err, names) = launched(|| kernel_vs_composed(&case, 8));
        let ran = |name: &str| names.iter().any(|n| n.contains(name));
        assert_eq!(
            (ran("pass_kernel"), ran("scan_kernel")),
            (!split, split),
            "{order:?} {gates:?}, split {split}: {names:?}"
        );
        assert!(ran("output_kernel"), "{order:?}: the node ran: {names:?}");
        worst = worst.max(err);
    }
    eprintln!("Nodes with split passes vs composed forms: largest relative RMS error {worst:.2e}");
}

/// More sequences × heads than one axis of the grid holds (65,535 cubes on wgpu, capped
/// at 4 here): the kernels' grid spreads over three axes, with idle cubes past the last
/// sequence, and every sequence still gets its cube.
#[test]
fn gpu_kernels_take_more_sequences_than_one_grid_axis() {
    let _switch = kernels(Kernels::All);
    let _cap = cap_grid(4);
    let mut worst: f64 = 0.0;
    for order in [Order::First, Order::Second, Order::Third, Order::Asymmetric] {
        // 7 × 3 = 21 cubes in a 4 × 4 × 2 grid.
        let case = Case {
            batch: 7,
            init_state: true,
            ..Case::new(order)
        };
        worst = worst.max(kernel_vs_composed(&case, 8));
    }
    eprintln!("GPU kernels on a spread grid vs composed forms: relative RMS error {worst:.2e}");
}

/// The largest relative RMS error of `case`'s routed chunked form (chunks of `chunk`:
/// the kernels or the node the test turned on) against its composed form on the wgpu
/// device, over the output, the final state and the gradients of q, k, v, the initial
/// state and data-dependent gates; fails past 1e-4.
fn kernel_vs_composed(case: &Case, chunk: usize) -> f64 {
    let (ad, order) = (gpu().autodiff(), case.order);
    let mut runs = Vec::new();
    for kernel in [true, false] {
        let (qkv, log_g, init) = case.tensors(&ad);
        let qkv: Vec<Tensor<4>> = qkv.into_iter().map(Tensor::require_grad).collect();
        let init: Vec<Tensor<4>> = init
            .into_iter()
            .flatten()
            .map(Tensor::require_grad)
            .collect();
        let log_g = match case.gates {
            Gates::Data { .. } => log_g.map(Tensor::require_grad),
            _ => log_g,
        };
        let x = input(&qkv, &log_g);
        let form = Form::Chunked(chunk);
        // Without an initial state, the output alone: the node from no state, returning
        // none, against the composed form from zeros.
        let (o, state) = match (kernel, case.init_state) {
            (true, true) => {
                let state = HlaState::from_tensors(order, init.clone());
                let (o, state) = forward(order, form, x, Some(state), case.output);
                (o, Some(state))
            }
            (true, false) => (output(order, form, x, None, case.output), None),
            (false, init_state) => {
                let state = match init_state {
                    true => HlaState::from_tensors(order, init.clone()),
                    false => HlaState::zeros(order, &x, case.output),
                };
                let (o, state) = composed(order, &x, state, chunk);
                (o, init_state.then_some(state))
            }
        };
        let mut rng = Rng::new(99);
        let mut loss = (o.clone() * rng.tensor(o.dims(), 1.0, &ad)).sum();
        let mut out = vec![o.clone()];
        for s in state.iter().flat_map(HlaState::tensors) {
            loss = loss + (s.clone() * rng.tensor(s.dims(), 1.0, &ad)).sum();
            out.push(s);
        }
        let grads = loss.backward();
        for x in qkv.iter().chain(&init) {
            out.push(x.grad(&grads).expect("gradient"));
        }
        if let Some(g) = log_g.filter(Tensor::is_require_grad) {
            out.push(g.grad(&grads).expect("gradient").unsqueeze());
        }
        runs.push(
            out.into_iter()
                .map(|t| to_cpu(t.inner()))
                .collect::<Vec<_>>(),
        );
    }
    let mut worst: f64 = 0.0;
    for (i, (got, want)) in runs[0].iter().zip(&runs[1]).enumerate() {
        let err = rel_rms(got, want);
        assert!(
            err <= 1e-4,
            "{order:?} T={} chunk {chunk}, result {i}: kernel vs composed {err:.3e} for {case:?}",
            case.time
        );
        worst = worst.max(err);
    }
    worst
}
