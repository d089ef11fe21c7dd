//! The GPU path: on the wgpu device the HLA forms (outputs, final states, gradients) and
//! one training step of the language model give ndarray's numbers for the same inputs
//! and weights, and the GPU kernels and the nodes give their composed forms' numbers. Shapes stay small:
//! a software Vulkan device (lavapipe, in CI) compiles every shader on the CPU. The tests
//! take turns ([`SWITCH`]): they switch the process-wide kernels, which are off by default
//! on a GPU.
#![cfg(all(feature = "wgpu", feature = "ndarray"))]

mod common;

use burn::optim::{AdamWConfig, GradientsParams};
use burn::prelude::*;
use common::{Case, Gates, MIXERS, Rng, input, param_grads, rel_rms, tiny};
use hla_model::backend::{Kernels, set_kernels};
use hla_model::hla::{
    Form, HlaInput, HlaState, Order, ahla, first, forward, output, second, third,
};
use hla_model::lm::{DecayKind, LmConfig};

/// A GPU sums in another order than a CPU, so f32 results differ by more than between
/// the forms on one device (1e-4).
const TOL: f64 = 1e-3;

fn gpu() -> Device {
    Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)
}

#[allow(deprecated)]
fn cpu() -> Device {
    Device::ndarray()
}

/// The same values as a plain tensor on the CPU, where the comparison is made.
fn to_cpu<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    Tensor::from_data(t.into_data(), &cpu())
}

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

#[test]
fn hla_forms_match_the_cpu() {
    let _switch = kernels(Kernels::default());
    let (gpu, cpu) = (gpu(), cpu());
    let mut worst: f64 = 0.0;
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
                        "{order:?} {form:?} {name}: wgpu vs ndarray {err:.3e} for {case:?}"
                    );
                    worst = worst.max(err);
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
/// forward kernels in every case, and its fused backward kernels wherever the gates need
/// no gradient.
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
        let (err, names) = launched(|| kernel_vs_composed(&case, chunk));
        let mut fused = match order {
            Order::Second => vec!["moments_kernel", "output_kernel", "pass_kernel"],
            _ => vec!["output_kernel", "pass_kernel"],
        };
        // The backward's moment products (with its reads' terms of ∂Q; its passes back are
        // pass kernels too), where the gates need no gradient.
        if !matches!(gates, Gates::Data { .. }) {
            fused.push("grads_kernel");
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

/// More sequences × heads than one axis of the grid holds (65,535 cubes on wgpu, capped
/// at 4 here): the kernels' grid spreads over three axes, with idle cubes past the last
/// sequence, and every sequence still gets its cube.
#[test]
fn gpu_kernels_take_more_sequences_than_one_grid_axis() {
    let _switch = kernels(Kernels::All);
    let _cap = GridCap::new(4);
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

/// Caps the kernels' grid axes while it lives.
struct GridCap;

impl GridCap {
    fn new(max: u32) -> Self {
        hla_model::backend::cap_grid_axis(Some(max));
        Self
    }
}

impl Drop for GridCap {
    fn drop(&mut self) {
        hla_model::backend::cap_grid_axis(None);
    }
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

/// The GPU kernels of the causal attention against Burn's attention op on the same device:
/// the output and the gradients of q, k and v within 1e-4 (relative RMS), over a whole
/// sequence and for queries from a later position (a cache's keys before them), within
/// one tile of rows and over several with a ragged last one (tiles hold at most 64 rows),
/// down to one query.
#[test]
fn gpu_attention_matches_the_composed_form() {
    let _switch = kernels(Kernels::All);
    let cases = [
        ([17, 17, 0], [8, 6]),
        ([5, 12, 7], [8, 6]),
        ([150, 150, 0], [8, 6]),
        ([70, 200, 130], [8, 6]),
        ([1, 77, 76], [8, 6]),
        ([100, 100, 0], [64, 64]),
    ];
    let worst = cases
        .into_iter()
        .map(|(sizes, widths)| attention_vs_composed([2, 3], sizes, widths))
        .fold(0.0, f64::max);
    eprintln!("GPU attention vs composed form: largest relative RMS error {worst:.2e}");
}

/// More tiles of rows than one axis of the grid holds in cubes (65,535 on wgpu, 4 here):
/// the grid spreads over three axes and every tile of queries, and every tile of keys,
/// still gets its cube.
#[test]
fn gpu_attention_takes_more_rows_than_one_grid_axis() {
    let _switch = kernels(Kernels::All);
    let _cap = GridCap::new(4);
    // 3 × 5 sequences of 130 rows in tiles of 64: 45 cubes in a 4 × 4 × 3 grid, 3 spare.
    let err = attention_vs_composed([3, 5], [130, 130, 0], [4, 3]);
    eprintln!("GPU attention on a spread grid vs composed form: relative RMS error {err:.2e}");
}

/// The largest relative RMS error of the attention kernels against Burn's attention op on
/// the wgpu device for `[batch, heads]`, `[queries, keys, start]` and widths `[d, dv]`,
/// over the output and the gradients of q, k and v; fails past 1e-4.
fn attention_vs_composed(
    [b, h]: [usize; 2],
    [queries, keys, start]: [usize; 3],
    [d, dv]: [usize; 2],
) -> f64 {
    use hla_model::lm::attention::{causal_attention, causal_attention_composed};
    let ad = gpu().autodiff();
    let mut rng = Rng::new(3);
    let (q, k, v) = (
        rng.tensor([b, h, queries, d], 1.0, &ad).require_grad(),
        rng.tensor([b, h, keys, d], 1.0, &ad).require_grad(),
        rng.tensor([b, h, keys, dv], 1.0, &ad).require_grad(),
    );
    let cotangent = rng.tensor([b, h, queries, dv], 1.0, &ad);
    let mut runs = Vec::new();
    for kernel in [true, false] {
        let run = || {
            let o = if kernel {
                causal_attention(q.clone(), k.clone(), v.clone(), start)
            } else {
                causal_attention_composed(q.clone(), k.clone(), v.clone(), start)
            };
            let grads = (o.clone() * cotangent.clone()).sum().backward();
            let mut out = vec![to_cpu(o.inner())];
            for x in [&q, &k, &v] {
                out.push(to_cpu(x.grad(&grads).expect("gradient")));
            }
            out
        };
        let (out, names) = launched(run);
        if kernel {
            for name in ["forward_kernel", "query_grads", "key_grads"] {
                assert!(
                    names.iter().any(|n| n.contains(name)),
                    "the attention's {name} ran: {names:?}"
                );
            }
        }
        runs.push(out);
    }
    let mut worst: f64 = 0.0;
    for (i, (got, want)) in runs[0].iter().zip(&runs[1]).enumerate() {
        let err = rel_rms(got, want);
        assert!(
            err <= 1e-4,
            "[{b}, {h}] Tq={queries} Tk={keys} start {start}, result {i}: kernel vs composed {err:.3e}"
        );
        worst = worst.max(err);
    }
    worst
}

fn tokens(batch: usize, time: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let mut rng = Rng::new(5);
    let values: Vec<i64> = (0..batch * time)
        .map(|_| rng.between(0.0, vocab as f64) as i64)
        .collect();
    Tensor::from_data(TensorData::new(values, [batch, time]), device)
}

/// The loss of one AdamW step's batch, and the loss after the step.
fn train_step(config: &LmConfig, weights: burn::store::ModuleRecord, device: &Device) -> [f32; 2] {
    let ad = device.clone().autodiff();
    let model = config.init(&ad).load_record(weights);
    let ids = tokens(3, 17, config.vocab_size, &ad);
    let (inputs, targets) = (ids.clone().slice(s![.., 0..16]), ids.slice(s![.., 1..17]));
    let loss = model.loss(inputs.clone(), targets.clone());
    let before = loss.clone().into_scalar::<f32>();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let model = AdamWConfig::new().init().step(1e-3, model, grads);
    [before, model.loss(inputs, targets).into_scalar::<f32>()]
}

/// The same weights (initialised on the CPU: seeded initialisation differs by backend)
/// give the same loss on both devices, before and after one AdamW step.
#[test]
fn lm_training_step_matches_the_cpu() {
    let _switch = kernels(Kernels::default());
    for mixer in MIXERS {
        let config = tiny(mixer);
        let cpu = cpu();
        cpu.seed(17);
        let weights = config.init(&cpu).into_record();
        let want = train_step(&config, weights.clone(), &cpu);
        let got = train_step(&config, weights, &gpu());
        for (g, w) in got.iter().zip(&want) {
            let err = f64::from((g - w).abs() / w.abs());
            assert!(
                err <= TOL,
                "{mixer:?}: loss {g} on wgpu, {w} on ndarray (before, after the step: {got:?} vs {want:?})"
            );
        }
        assert!(
            want[1] < want[0],
            "{mixer:?}: the step lowered no loss: {want:?}"
        );
    }
}

/// End to end on the GPU: for every mixer with GPU kernels, one language model's loss and
/// the gradient of every parameter are the same with the kernels on and off (their
/// composed forms).
#[test]
fn gpu_kernels_change_no_loss_and_no_gradient() {
    let _switch = kernels(Kernels::All);
    let ad = gpu().autodiff();
    let mixers = MIXERS
        .into_iter()
        .filter(|m| m.has_kernels(DecayKind::Fixed, &ad));
    for mixer in mixers {
        let config = tiny(mixer);
        ad.seed(3);
        let lm = config.init(&ad);
        let ids = tokens(3, 22, config.vocab_size, &ad);
        let (inputs, targets) = (ids.clone().slice(s![.., 0..21]), ids.slice(s![.., 1..22]));
        let mut runs = Vec::new();
        for kernels in [Kernels::All, Kernels::None] {
            set_kernels(kernels);
            let loss = lm.loss(inputs.clone(), targets.clone());
            let grads = param_grads(&lm, &loss.backward());
            runs.push((
                to_cpu(loss.inner()),
                grads.into_iter().map(to_cpu).collect::<Vec<_>>(),
            ));
        }
        let ((loss, grads), (want_loss, want_grads)) = (&runs[0], &runs[1]);
        let error = rel_rms(loss, want_loss);
        assert!(error < 1e-5, "{mixer:?}: loss error {error:e}");
        for (i, (g, w)) in grads.iter().zip(want_grads).enumerate() {
            let error = rel_rms(g, w);
            assert!(
                error < 1e-4,
                "{mixer:?}: parameter {i}: gradient error {error:e}"
            );
        }
    }
}

/// The tests switch the process-wide kernels; they take turns.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A test's turn at [`SWITCH`] with the kernels set to `kernels`: the GPU kernels' tests
/// turn them on (they are off by default); the default comes back when the turn ends.
fn kernels(kernels: Kernels) -> Turn {
    let guard = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_kernels(kernels);
    Turn { _guard: guard }
}

struct Turn {
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        set_kernels(Kernels::default());
    }
}

/// What `f` returns, and the names of the kernels it launched.
fn launched<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use burn_cubecl::cubecl::logging::{LaunchObservation, LaunchObserver};
    use std::sync::{Arc, Mutex};
    #[derive(Default)]
    struct Names(Mutex<Vec<String>>);
    impl LaunchObserver for Names {
        fn launched(&self, kernel: &'static str) {
            self.0.lock().unwrap().push(kernel.to_string());
        }
    }
    let names = Arc::new(Names::default());
    let observation = LaunchObservation::new(names.clone());
    let out = f();
    drop(observation);
    let names = names.0.lock().unwrap().clone();
    (out, names)
}
