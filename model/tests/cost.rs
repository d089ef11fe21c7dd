//! The cost model (`hla_model::bench::cost`) against what the wgpu device runs (lavapipe in
//! CI): its dry run launches the kernels a real pass launches (with the fixed decay and
//! with data-dependent gates), a pass moves at least its inputs, outputs and gradients, the
//! node's forward products are all in fused kernels, each state's updates and scan one
//! kernel, and its backward runs a fused kernel per state read and per moment product. The
//! tests take turns: they switch the process-wide kernels.
#![cfg(feature = "wgpu")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use burn::prelude::*;
use burn_cubecl::cubecl::logging::{LaunchObservation, LaunchObserver};
use hla_model::backend::cost::blocks;
use hla_model::backend::{
    Kernels, TensorCores, plan_multiprocessors, set_kernels, set_tensor_cores,
};
use hla_model::bench::cost::{CUDA_MULTIPROCESSORS, Engine, Step, form_cost};
use hla_model::bench::{Gating, Operator, OperatorInputs, Shape5};
use hla_model::hla::Form;

/// Every operator with a GPU form.
const OPERATORS: [Operator; 5] = [
    Operator::Hla2Chunked,
    Operator::Hla3Chunked,
    Operator::LinearChunked,
    Operator::AhlaChunked,
    Operator::Softmax,
];

/// The kernels, the node and the composed form.
const ROUTES: [Kernels; 3] = [Kernels::All, Kernels::Nodes, Kernels::None];

/// Small enough for lavapipe; T = 40 leaves a ragged last chunk.
const SHAPE: Shape5 = Shape5 {
    batch: 2,
    heads: 3,
    time: 40,
    d: 8,
    dv: 8,
    chunk: 16,
};

fn gpu() -> Device {
    Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)
}

static SWITCH: Mutex<()> = Mutex::new(());

/// A test's turn at the process-wide kernels (and tensor cores); the defaults come back
/// when it ends.
struct Turn(#[allow(dead_code)] MutexGuard<'static, ()>);

fn turn() -> Turn {
    Turn(SWITCH.lock().unwrap_or_else(|e| e.into_inner()))
}

impl Drop for Turn {
    fn drop(&mut self) {
        set_kernels(Kernels::default());
        set_tensor_cores(TensorCores::default());
        plan_multiprocessors(None);
    }
}

struct Counter(AtomicUsize);

impl LaunchObserver for Counter {
    fn launched(&self, _kernel: &'static str) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// One forward+backward pass of `op` on `inputs` with `route`'s kernels.
fn pass(op: Operator, route: Kernels, inputs: &OperatorInputs, device: &Device) {
    set_kernels(route);
    drop(inputs.forward_backward(op, Form::Chunked(SHAPE.chunk)));
    device.sync().expect("the device runs the pass");
}

/// Inputs at [`SHAPE`] with the fixed decay on `device`, made before any pass is observed.
fn inputs(device: &Device) -> OperatorInputs {
    gated_inputs(Gating::Fixed, device)
}

/// Inputs at [`SHAPE`] with `gating`'s gates on `device`, made before any pass is observed.
fn gated_inputs(gating: Gating, device: &Device) -> OperatorInputs {
    let inputs = OperatorInputs::gated(&SHAPE, gating, device);
    device.sync().expect("the device makes the inputs");
    inputs
}

/// Kernels a real pass launches once warm (the first pass also runs the autotuner's
/// candidates), its grids planned for the GPU the cost model names, as its dry run plans
/// them.
fn launched(op: Operator, route: Kernels, gating: Gating) -> usize {
    plan_multiprocessors(Some(CUDA_MULTIPROCESSORS));
    let device = gpu().autodiff();
    let inputs = gated_inputs(gating, &device);
    pass(op, route, &inputs, &device);
    let counter = Arc::new(Counter(AtomicUsize::new(0)));
    let observation = LaunchObservation::new(counter.clone());
    pass(op, route, &inputs, &device);
    drop(observation);
    plan_multiprocessors(None);
    counter.0.load(Ordering::Relaxed)
}

/// With the fixed decay every operator's forms; with data-dependent gates (and their
/// gradient) the HLA orders' (the softmax attention has no gates).
#[test]
fn a_dry_run_launches_what_a_real_pass_launches() {
    let _turn = turn();
    let cases = OPERATORS.map(|op| (op, Gating::Fixed)).into_iter().chain(
        OPERATORS
            .into_iter()
            .filter(|&op| op != Operator::Softmax)
            .map(|op| (op, Gating::Data)),
    );
    for (op, gating) in cases {
        for route in ROUTES {
            let Some(steps) = form_cost(op, route, &SHAPE, gating, &gpu()).expect("the cost model")
            else {
                continue;
            };
            let modelled: usize = steps.iter().map(|s| s.launches).sum();
            let real = launched(op, route, gating);
            eprintln!("{op:?} {route:?} {gating:?}: {modelled} launches modelled, {real} real");
            assert_eq!(modelled, real, "{op:?} with {route:?} and {gating:?} gates");
        }
    }
}

#[test]
fn a_pass_moves_at_least_its_inputs_outputs_and_gradients() {
    let _turn = turn();
    let floats = |d: usize| (SHAPE.batch * SHAPE.heads * SHAPE.time * d) as f64;
    // q, k, v and o's gradient read; o, ∂q, ∂k, ∂v written: 4 bytes a float.
    let io = 4.0 * 2.0 * (2.0 * floats(SHAPE.d) + 2.0 * floats(SHAPE.dv));
    for op in OPERATORS {
        for route in ROUTES {
            let Some(steps) =
                form_cost(op, route, &SHAPE, Gating::Fixed, &gpu()).expect("the cost model")
            else {
                continue;
            };
            let bytes: f64 = steps.iter().map(|s| s.bytes).sum();
            let flops: f64 = steps.iter().map(|s| s.flops).sum();
            eprintln!("{op:?} {route:?}: {bytes} bytes, {flops} FLOPs; the pass's I/O {io}");
            assert!(bytes >= io, "{op:?} with {route:?}: {bytes} < {io}");
            assert!(flops > 0.0, "{op:?} with {route:?}");
        }
    }
}

/// The node's forward pass at [`SHAPE`] (gated, three chunks) runs no matmul: every
/// product of the chunk equations is in a fused kernel, each run as often as its order's
/// equations ask (hla2's moments; the output step), and each state part's updates and
/// scan over the chunks are one pass kernel (no tensor of updates, no decay-mask
/// products).
#[test]
fn the_nodes_forward_products_are_fused_kernels_and_each_state_one_pass() {
    let _turn = turn();
    // The state parts (a pass each), then the moments' and outputs' kernels.
    for (op, parts, fused) in [
        (Operator::Hla2Chunked, 2, [1, 1]),
        (Operator::Hla3Chunked, 3, [0, 3]),
        (Operator::LinearChunked, 1, [0, 1]),
        (Operator::AhlaChunked, 2, [0, 2]),
    ] {
        let device = gpu();
        let inputs = inputs(&device);
        set_kernels(Kernels::Nodes);
        let (_, blocks) = blocks(&device, || {
            drop(inputs.forward(op, Form::Chunked(SHAPE.chunk)));
            device.sync().expect("the device runs the pass");
        })
        .expect("a dry run of the pass");
        let ran = |name: &str| -> Vec<usize> {
            blocks
                .iter()
                .filter(|b| b.custom.as_deref().is_some_and(|id| id.contains(name)))
                .map(|b| b.launches)
                .collect()
        };
        let matmuls: f64 = blocks.iter().map(|b| b.matmul_flops).sum();
        assert_eq!(matmuls, 0.0, "{op:?}: a matmul left in the forward pass");
        let kernels = ["hla2_moments", "chunk_output"].map(|n| ran(n).len());
        assert_eq!(kernels, fused, "{op:?}: its fused kernels");
        let passes = ran("chunk_pass");
        assert_eq!(passes.len(), parts, "{op:?}: one pass per state part");
        assert!(passes.iter().all(|&launches| launches == 1), "{op:?}");
        assert!(
            ran("chunk_scan").is_empty(),
            "{op:?}: a scan beside the passes"
        );
    }
}

/// The node's backward pass at [`SHAPE`], with the fixed decay or with data-dependent
/// gates and their gradient, runs a pass back over the chunks per state part it reads (its
/// updates and scan back in one kernel) and a fused kernel per moment product its order's
/// equations have (first order's output, hla2's output and `W K`, third order's output,
/// `W K` and `W V`, AHLA's `A B` and `A V`), which adds each read's term of `∂Q` too (and
/// of the gates' gradient).
#[test]
fn the_nodes_backward_runs_a_fused_kernel_per_read_and_moment_product() {
    let _turn = turn();
    let orders = [
        (Operator::Hla2Chunked, 2, 2),
        (Operator::Hla3Chunked, 3, 3),
        (Operator::LinearChunked, 1, 1),
        (Operator::AhlaChunked, 2, 2),
    ];
    let cases = [Gating::Fixed, Gating::Data]
        .into_iter()
        .flat_map(|gating| orders.map(|order| (order, gating)));
    for ((op, reads, products), gating) in cases {
        let device = gpu().autodiff();
        let inputs = gated_inputs(gating, &device);
        let (_, blocks) = blocks(&device, || pass(op, Kernels::Nodes, &inputs, &device))
            .expect("a dry run of the pass");
        let ran = |name: &str| -> usize {
            blocks
                .iter()
                .filter(|b| b.custom.as_deref().is_some_and(|id| id.contains(name)))
                .map(|b| b.launches)
                .sum()
        };
        // The forward pass's passes, one per state part, and the backward's.
        assert_eq!(
            ran("chunk_pass"),
            2 * reads,
            "{op:?} {gating:?}: the passes"
        );
        assert_eq!(ran("chunk_scan"), 0, "{op:?} {gating:?}: a scan");
        assert_eq!(
            ran("moment_grads"),
            products,
            "{op:?} {gating:?}: the moment product's kernel"
        );
    }
}

/// At a head width whose tiles lavapipe's 32 KiB of shared memory cannot hold (d = 128:
/// 96 KiB at chunk 64), the node falls back to its composed steps there (matmuls), but the
/// cost model plans as the GPU it names (227 KiB, TF32 tensor cores): its node runs no
/// matmul, forward or backward, its fused kernels are counted though lavapipe could not
/// compile them, and its output step and its backward's moment products run on the
/// tensor cores unless they are off; the data-dependent gates' gradient adds no launch.
/// It plans the GPU's multiprocessors too: one sequence's passes split.
#[test]
fn the_cost_model_plans_for_the_named_gpus_shared_memory() {
    let _turn = turn();
    let wide = Shape5 {
        batch: 1,
        heads: 1,
        time: 64,
        d: 128,
        dv: 128,
        chunk: 64,
    };
    let device = gpu();
    let inputs = OperatorInputs::random(&wide, &device);
    set_kernels(Kernels::Nodes);
    let (_, on_lavapipe) = blocks(&device, || {
        drop(inputs.forward(Operator::Hla2Chunked, Form::Chunked(wide.chunk)));
        device.sync().expect("the device runs the pass");
    })
    .expect("a dry run of the pass");
    let matmuls: f64 = on_lavapipe.iter().map(|b| b.matmul_flops).sum();
    assert!(matmuls > 0.0, "lavapipe's own plan falls back to matmuls");

    // One sequence's passes would leave most of the GPU idle: its plan splits each into
    // the composed update (a matmul) and the scan; back, each read's term of ∂Q is a
    // matmul of its own then.
    let one = form_cost(
        Operator::Hla2Chunked,
        Kernels::Nodes,
        &wide,
        Gating::Fixed,
        &gpu(),
    )
    .expect("the cost model reads the node")
    .expect("hla2 has a node");
    let matmuls = one.iter().filter(|s| s.engine == Engine::Matmul).count();
    assert_eq!(
        matmuls, 6,
        "two updates forward, two back, two terms: {one:?}"
    );

    // Enough sequences that the passes fill the GPU (4 cubes each at d = 128).
    let wide = Shape5 {
        batch: 4,
        heads: 16,
        ..wide
    };
    let cost = |gating| {
        form_cost(Operator::Hla2Chunked, Kernels::Nodes, &wide, gating, &gpu())
            .expect("the cost model reads the node")
            .expect("hla2 has a node")
    };
    let steps = cost(Gating::Fixed);
    let matmul = |s: &&Step| s.engine == Engine::Matmul;
    assert_eq!(steps.iter().filter(matmul).count(), 0, "{steps:?}");
    let count = |steps: &[Step], tensor: bool| {
        let engine = |s: &&Step| match s.engine {
            Engine::Kernel { .. } => !tensor,
            Engine::TensorKernel { .. } => tensor,
            _ => false,
        };
        steps.iter().filter(engine).count()
    };
    // Forward: two passes, the moments and the output; backward: two reads' passes back,
    // two products (with the data-dependent gates' gradient as well): all on the tensor
    // cores (d = dv = 128 and the chunk tile into TF32 fragments).
    assert_eq!(count(&steps, false), 0, "{steps:?}");
    assert_eq!(count(&steps, true), 8, "{steps:?}");
    let gated = cost(Gating::Data);
    assert_eq!(count(&gated, true), 8, "data gates: {gated:?}");
    // The gates' gradient is gathered inside the backward's kernels: no launch of its own,
    // and the budget of 11 a step holds with it.
    let launches = |steps: &[Step]| steps.iter().map(|s| s.launches).sum::<usize>();
    assert_eq!(launches(&gated), launches(&steps), "data gates: {gated:?}");
    assert!(launches(&gated) <= 11, "data gates: {gated:?}");
    set_tensor_cores(TensorCores::Off);
    let off = cost(Gating::Fixed);
    assert_eq!(count(&off, true), 0, "tensor cores off: {off:?}");
    assert!(count(&off, false) >= 8, "tensor cores off: {off:?}");
}
