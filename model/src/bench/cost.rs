//! The cost model's work of one operator's forward and backward pass on a GPU, for each
//! form a GPU device can run it in: the hand-written kernels, the chunked HLA's node and
//! the composed form. Read off what the form does on a CubeCL device
//! ([`crate::backend::cost`]) at the problem's own shape: Burn's fusion and matmul plans
//! change with the shape (one sequence of one head launches other kernels than six do),
//! so no figure is scaled from a smaller problem.
//!
//! Fusion sees a hand-written kernel as one custom op: its inputs and outputs. What it does
//! inside is the kernel's own plan, said here from the kernels' layout. In the HLA
//! kernels each product is one unit per output value with two global loads per
//! multiply-add (no shared memory, no register tile), so 4 bytes per FLOP, and they write
//! and read their workspace once per chunk; their products are the node's (the same chunk
//! equations), the backward kernel's the node's forward and backward (it recomputes each
//! chunk's forward from the saved start states). The attention's products are its
//! kernels' own over the (query, key) pairs a causal sequence sees (on the tensor cores
//! where a pass's tiles take TF32 fragments, the backward recomputing the scores in each
//! of its two kernels); its global reads are its shared tiles' ([`Plan`]), with
//! the tiles an H100 or H200 holds ([`CUDA_SHARED_BYTES`]).
//!
//! Every form plans its tiles for that GPU's shared memory and its grids for that GPU's
//! multiprocessors too, whatever the device the dry run reads on ([`PlannedGpu`]): on
//! lavapipe (32 KiB) the node's fused kernels at d = 128 (96 KiB) would fall back to
//! their composed steps, which an H100 never runs.
//! A launch the device cannot compile is counted and dropped by the dry run, never run.

use burn::prelude::*;

use super::{Gating, Operator, OperatorInputs, Shape5};
use crate::backend::cost::{Block, blocks};
use crate::backend::gpu::PlannedGpu;
use crate::backend::gpu::mma::CUDA_TF32;
use crate::backend::{Kernels, TensorCores, kernels, set_kernels, tensor_cores};
use crate::hla::Form;
use crate::lm::attention::gpu::Plan;

/// The shared memory a cube may hold on an H100 or H200 (227 KiB, the opt-in limit
/// cubecl's CUDA runtime reports and sizes the attention's tiles by).
pub const CUDA_SHARED_BYTES: usize = 227 * 1024;

/// The streaming multiprocessors of an H100 or H200 SXM (132, NVIDIA's datasheets).
pub const CUDA_MULTIPROCESSORS: usize = 132;

/// The most units of a cube the kernels launch.
const UNITS: usize = 256;

/// What runs a step of a form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Burn's matmul (on CUDA with tensor cores: TF32 for f32).
    Matmul,
    /// Elementwise, reductions and copies (fused or alone): bound by memory.
    Memory,
    /// A hand-written kernel on the CUDA cores, with this many cubes (one per SM at most).
    Kernel { cubes: usize },
    /// A hand-written kernel whose products run on the tensor cores (TF32), with this many
    /// cubes.
    TensorKernel { cubes: usize },
}

/// One step of a form: launches of one engine and their work.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub engine: Engine,
    pub launches: usize,
    pub flops: f64,
    /// Global-memory traffic.
    pub bytes: f64,
    /// The hand-written kernel it ran (fusion's id of its custom op), if one.
    pub kernel: Option<String>,
}

/// The steps of `op`'s forward and backward pass at `shape` with `gating`'s gates and
/// `route`'s kernels ([`Kernels::All`]: the hand-written GPU kernels; [`Kernels::Nodes`]:
/// the node; [`Kernels::None`]: the composed form), read on `device`, a CubeCL device.
/// `None` where the form does not exist (no node for softmax attention or the recurrence).
/// Where a form cannot take the gates (the hand-written kernels and data-dependent gates),
/// its steps are those of what runs instead.
pub fn form_cost(
    op: Operator,
    route: Kernels,
    shape: &Shape5,
    gating: Gating,
    device: &Device,
) -> Result<Option<Vec<Step>>, String> {
    if op == Operator::Hla2Recurrent || (route == Kernels::Nodes && !op.has_node()) {
        return Ok(None);
    }
    let problem = Problem { shape, gating };
    let observed = observe(op, route, problem, device, true)?;
    let kernel_flops = match route {
        Kernels::All => Some(KernelFlops::of(op, problem, device)?),
        _ => None,
    };
    let steps = observed
        .into_iter()
        .filter(|b| b.launches > 0)
        .map(|b| step(&b, op, shape, kernel_flops.as_ref()))
        .collect();
    Ok(Some(steps))
}

/// An operator's problem: its shape and gates.
#[derive(Clone, Copy)]
struct Problem<'a> {
    shape: &'a Shape5,
    gating: Gating,
}

/// The blocks of one pass of `op` (forward and backward when `backward`) with `route`'s
/// kernels on `problem`.
fn observe(
    op: Operator,
    route: Kernels,
    Problem { shape, gating }: Problem,
    device: &Device,
    backward: bool,
) -> Result<Vec<Block>, String> {
    let before = kernels();
    set_kernels(route);
    let _planned = PlannedGpu::new(CUDA_SHARED_BYTES, CUDA_MULTIPROCESSORS);
    let device = if backward {
        device.clone().autodiff()
    } else {
        device.clone()
    };
    let inputs = OperatorInputs::gated(shape, gating, &device);
    let form = Form::Chunked(shape.chunk);
    let ran = blocks(&device, || {
        if backward {
            drop(inputs.forward_backward(op, form));
        } else {
            drop(inputs.forward(op, form));
        }
        device.sync().map_err(|e| format!("{e:?}"))
    });
    set_kernels(before);
    let (synced, blocks) = ran?;
    synced?;
    Ok(blocks)
}

/// The FLOPs of the hand-written forward and backward kernels of an operator.
struct KernelFlops {
    forward: f64,
    backward: f64,
}

impl KernelFlops {
    /// The node's products for the HLA orders (the kernels compute its chunk equations);
    /// the attention's own, [`Self::attention`].
    fn of(op: Operator, problem: Problem, device: &Device) -> Result<Self, String> {
        if !op.has_node() {
            return Ok(Self::attention(problem.shape));
        }
        let matmuls = |blocks: &[Block]| -> f64 { blocks.iter().map(|b| b.matmul_flops).sum() };
        let kernels = |blocks: &[Block]| -> f64 {
            let steps = blocks
                .iter()
                .filter_map(|b| node_kernel(b, b.custom.as_deref()?));
            steps.map(|step| step.flops).sum()
        };
        let forward_blocks = observe(op, Kernels::Nodes, problem, device, false)?;
        let both_blocks = observe(op, Kernels::Nodes, problem, device, true)?;
        let (forward, both) = (matmuls(&forward_blocks), matmuls(&both_blocks));
        // The node's fused forward kernels are no matmuls: what they took is the chunk
        // equations' count less the forward's matmuls, in both passes; its fused backward
        // kernels count their own products.
        let fused = op
            .chunked_flops(problem.shape)
            .map_or(0.0, |all| all - forward);
        let backward_kernels = kernels(&both_blocks) - kernels(&forward_blocks);
        Ok(Self {
            forward: forward + fused,
            backward: both + fused + backward_kernels,
        })
    }

    /// The attention kernels' products over the (query, key) pairs a causal sequence
    /// sees: forward `q·k` and `p v` (2d + 2dv FLOPs a pair); backward the scores twice,
    /// `∂O·v` twice, `∂q`, `∂k` and `∂v` (8d + 6dv), as its query and key kernels compute
    /// them.
    fn attention(shape: &Shape5) -> Self {
        let pairs = (shape.batch * shape.heads * shape.time * (shape.time + 1) / 2) as f64;
        let (d, dv) = (shape.d as f64, shape.dv as f64);
        Self {
            forward: pairs * 2.0 * (d + dv),
            backward: pairs * (8.0 * d + 6.0 * dv),
        }
    }
}

/// A block as a step.
fn step(block: &Block, op: Operator, shape: &Shape5, kernel: Option<&KernelFlops>) -> Step {
    let custom = block.custom.as_deref();
    if let Some(step) = custom.and_then(|id| node_kernel(block, id)) {
        return step;
    }
    let (engine, flops, inside) = match (custom, kernel) {
        (Some(id), Some(kernel)) => {
            let flops = if id.ends_with("backward") {
                kernel.backward
            } else {
                kernel.forward
            };
            let forward = !id.ends_with("backward");
            let inside = inside_bytes(op, shape, forward, flops);
            let cubes = cubes(op, shape);
            match attention_on_tensor_cores(op, shape, forward) {
                true => (Engine::TensorKernel { cubes }, flops, inside),
                false => (Engine::Kernel { cubes }, flops, inside),
            }
        }
        _ if block.matmul_flops > 0.0 => {
            (Engine::Matmul, block.matmul_flops + block.other_flops, 0.0)
        }
        _ => (Engine::Memory, block.other_flops, 0.0),
    };
    Step {
        engine,
        launches: block.launches,
        flops,
        bytes: block.bytes + inside,
        kernel: block.custom.clone(),
    }
}

/// A block that ran one of the node's fused kernels (`crate::hla::chunks::fused`,
/// `crate::hla::second::fused`, `crate::hla::node::fused`): one cube per chunk of every
/// sequence (a pass: per tile of every sequence's state), the FLOPs of its products (on
/// the tensor cores where the passes, the output step, hla2's moments or the backward's
/// moment products run as tiles there), no
/// global traffic but its inputs and outputs (it reads each once into shared memory).
fn node_kernel(block: &Block, id: &str) -> Option<Step> {
    let inputs = &block.custom_inputs;
    let flops = crate::hla::chunks::fused::flops(id, inputs)
        .or_else(|| crate::hla::second::fused::flops(id, inputs))
        .or_else(|| crate::hla::node::fused::flops(id, inputs))?;
    let outputs = &block.custom_outputs;
    let pass = crate::hla::chunks::fused::pass::planned_grid(
        id,
        (inputs, outputs),
        CUDA_SHARED_BYTES,
        UNITS,
    );
    let cubes = pass.map_or(inputs[0][0], |(cubes, _)| cubes);
    let tiles = pass.is_some_and(|(_, tensor)| tensor)
        || crate::hla::chunks::fused::planned_tiles(id, inputs, CUDA_SHARED_BYTES)
        || crate::hla::node::fused::planned_tiles(id, inputs, outputs, CUDA_SHARED_BYTES);
    let engine = match tiles {
        true => Engine::TensorKernel { cubes },
        false => Engine::Kernel { cubes },
    };
    Some(Step {
        engine,
        launches: block.launches,
        flops,
        bytes: block.bytes,
        kernel: Some(id.to_string()),
    })
}

/// Cubes of the hand-written kernels: one per sequence and head for the HLA's, one per
/// tile of queries of every sequence for the attention's forward.
fn cubes(op: Operator, shape: &Shape5) -> usize {
    let sequences = shape.batch * shape.heads;
    match op.chunked_order() {
        Some(_) => sequences,
        None => sequences * attention_plan(shape).cubes,
    }
}

/// Bytes the hand-written kernels of `op` read and write besides their inputs and outputs,
/// in their forward or backward pass of `flops`: the HLA kernels' loads for their
/// products and their workspace, the attention's shared tiles.
fn inside_bytes(op: Operator, shape: &Shape5, forward: bool, flops: f64) -> f64 {
    let sequences = (shape.batch * shape.heads) as f64;
    match op.chunked_order() {
        Some(order) => 4.0 * flops + workspace_bytes(order, shape, forward),
        None => {
            let plan = attention_plan(shape);
            let floats = if forward {
                plan.forward_tile_floats
            } else {
                plan.backward_tile_floats
            };
            4.0 * floats as f64 * sequences
        }
    }
}

/// Whether the attention's forward (or backward) pass runs its products on the tensor
/// cores of an H100 or H200 at `shape` (its tiles whole TF32 fragments that fit the shared
/// memory; not with `--tensor-cores off`).
fn attention_on_tensor_cores(op: Operator, shape: &Shape5, forward: bool) -> bool {
    use crate::lm::attention::gpu::{Pass, tensor_tiles};
    let pass = if forward {
        Pass::Forward
    } else {
        Pass::Backward
    };
    let widths = [shape.d, shape.dv];
    let tiles = tensor_tiles(pass, CUDA_SHARED_BYTES, widths, shape.time, &CUDA_TF32);
    op.chunked_order().is_none() && tensor_cores() != TensorCores::Off && tiles.is_some()
}

/// The attention kernels' plan at `shape` (a whole sequence of queries) on an H100 or
/// H200.
fn attention_plan(shape: &Shape5) -> Plan {
    Plan::of(
        [shape.time, shape.time, 0],
        [shape.d, shape.dv],
        CUDA_SHARED_BYTES,
        UNITS,
    )
    .expect("a head's tiles fit 227 KiB")
}

/// Bytes the HLA kernels of `order` move through their workspace: written and read once
/// per chunk, by every cube.
fn workspace_bytes(order: crate::hla::Order, shape: &Shape5, forward: bool) -> f64 {
    let [f, b] = (crate::hla::gpu_kernels(order).workspace)(shape.chunk, shape.d, shape.dv);
    let floats = if forward { f } else { b };
    let chunks = shape.time.div_ceil(shape.chunk);
    2.0 * 4.0 * (floats * chunks * shape.batch * shape.heads) as f64
}
