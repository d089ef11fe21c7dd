//! The cost model (`hla bench --only cost`): for each mixer's operator and each form a GPU
//! device can run it in, what its forward+backward pass launches, computes and moves at a
//! given shape, and the roofline time of that on a named GPU. The figures are read off the
//! form's own launch plan on the device at hand (a dry run: kernels are compiled, not run;
//! lavapipe will do), so the design can be judged without a GPU and measured times read
//! against it where one is lent.

use std::fmt::Write as _;

use anyhow::Result;
use burn::prelude::*;
use hla_model::bench::{Gating, Shape5};
use serde::{Deserialize, Serialize};

/// A form the cost model reads (`--cost-form`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CostForm {
    /// The hand-written GPU kernels.
    Kernels,
    /// The chunked HLA as one autodiff node (HLA and linear attention only).
    Node,
    /// Burn's ops.
    Composed,
}

/// What the cost model reads: which mixers (empty: all) and which forms (empty: all).
// A build without a GPU device has no cost model to select from.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub(super) struct Selection<'a> {
    pub mixers: &'a [hla_model::lm::MixerKind],
    pub forms: &'a [CostForm],
}

/// A GPU whose peak figures the roofline uses.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gpu {
    /// NVIDIA H100 SXM5.
    H100,
    /// NVIDIA H200 SXM.
    H200,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
/// A GPU's peaks: streaming multiprocessors, FLOP/s on CUDA cores (FP32) and on tensor
/// cores (TF32, dense), and memory bandwidth in bytes/s.
struct Peaks {
    sms: usize,
    fp32: f64,
    tf32: f64,
    bandwidth: f64,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl Gpu {
    fn name(self) -> &'static str {
        match self {
            Self::H100 => "H100 SXM",
            Self::H200 => "H200 SXM",
        }
    }

    /// From NVIDIA's datasheets: the H100 Tensor Core GPU datasheet (SXM5: 132 SMs, FP32
    /// 67 TFLOPS, TF32 tensor core 989 TFLOPS with sparsity, so 494.7 dense, HBM3
    /// 3.35 TB/s) and the H200 datasheet (the same chip's compute, HBM3e 4.8 TB/s).
    fn peaks(self) -> Peaks {
        let bandwidth = match self {
            Self::H100 => 3.35e12,
            Self::H200 => 4.8e12,
        };
        Peaks {
            sms: hla_model::bench::cost::CUDA_MULTIPROCESSORS,
            fp32: 66.9e12,
            tf32: 494.7e12,
            bandwidth,
        }
    }
}

/// One operator in one form, forward+backward.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CostRow {
    pub mixer: String,
    /// `kernels` (the hand-written GPU kernels), `node` or `composed`.
    pub form: String,
    pub launches: usize,
    pub flops: f64,
    /// Global-memory traffic.
    pub bytes: f64,
    /// Σ over the steps of max(compute time, memory time) at the GPU's peaks.
    pub roofline_ms: f64,
    /// Where the time goes: the steps by what runs them, in order of first launch (reports
    /// written before say none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<CostPart>,
}

/// The steps of a form that one engine runs: one hand-written kernel, Burn's matmuls, or
/// its elementwise ops, reductions and copies.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct CostPart {
    /// The hand-written kernel (fusion's id of its custom op), else `matmul` (Burn's) or
    /// `memory` (Burn's elementwise ops, reductions and copies, fused or alone).
    pub what: String,
    /// What bounds it: `tensor cores` (a matmul), `memory-bound`, or a hand-written
    /// kernel's `cuda cores` or `tensor cores` with its cubes.
    pub engine: String,
    pub launches: usize,
    pub flops: f64,
    pub bytes: f64,
    pub roofline_ms: f64,
}

/// The cost model's section of a report.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Cost {
    pub gpu: String,
    pub batch: usize,
    pub heads: usize,
    pub time: usize,
    pub d: usize,
    pub chunk: usize,
    /// The gates ([`Gating`]'s name; reports written before the option say none: theirs
    /// were fixed).
    #[serde(default = "super::fixed_gates")]
    pub gates: String,
    pub rows: Vec<CostRow>,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use hla_model::{backend::Kernels, bench::Operator};

/// The operators of the mixers with a chunked or kernel form, by mixer name.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
const MIXERS: [(Operator, &str); 5] = [
    (Operator::Hla2Chunked, "hla2"),
    (Operator::Hla3Chunked, "hla3"),
    (Operator::LinearChunked, "linear"),
    (Operator::AhlaChunked, "ahla"),
    (Operator::Softmax, "softmax"),
];

#[cfg(any(feature = "wgpu", feature = "cuda"))]
const FORMS: [(Kernels, CostForm); 3] = [
    (Kernels::All, CostForm::Kernels),
    (Kernels::Nodes, CostForm::Node),
    (Kernels::None, CostForm::Composed),
];

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl CostForm {
    /// Its name in the report's rows (and on the command line).
    fn name(self) -> &'static str {
        match self {
            Self::Kernels => "kernels",
            Self::Node => "node",
            Self::Composed => "composed",
        }
    }
}

/// The cost of the selected mixers' forms at `shape` with `gates` on `gpu`, read on
/// `device` (a CubeCL device).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(super) fn cost(
    device: &Device,
    (shape, gates): (&Shape5, Gating),
    gpu: Gpu,
    only: Selection,
) -> Result<Cost> {
    use anyhow::anyhow;
    use hla_model::bench::cost::form_cost;

    if !hla_model::backend::on_gpu(device) {
        return Err(not_cubecl());
    }
    let mixers = MIXERS.into_iter().filter(|(_, name)| {
        only.mixers.is_empty() || only.mixers.iter().any(|m| m.name() == *name)
    });
    let mut rows = Vec::new();
    for (op, mixer) in mixers {
        let forms = FORMS
            .into_iter()
            .filter(|(_, f)| only.forms.is_empty() || only.forms.contains(f));
        for (route, form) in forms {
            let form = form.name();
            eprintln!("cost: {mixer} {form}");
            let steps = form_cost(op, route, shape, gates, device)
                .map_err(|e| anyhow!("reading the {form} form of {mixer}: {e}"))?;
            if let Some(steps) = steps {
                rows.push(row(mixer, form, &steps, gpu.peaks()));
            }
        }
    }
    Ok(Cost {
        gpu: gpu.name().into(),
        batch: shape.batch,
        heads: shape.heads,
        time: shape.time,
        d: shape.d,
        chunk: shape.chunk,
        gates: gates.name().into(),
        rows,
    })
}

/// No GPU device compiled in: the cost model has nothing to read.
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
pub(super) fn cost(
    _device: &Device,
    _problem: (&Shape5, Gating),
    _gpu: Gpu,
    _only: Selection,
) -> Result<Cost> {
    Err(not_cubecl())
}

fn not_cubecl() -> anyhow::Error {
    crate::run::usage::usage(
        "the cost model (--only cost) reads the GPU forms' launch plans on a CubeCL device: \
         run it with --device wgpu (a software Vulkan device such as lavapipe will do) or \
         --device cuda, in a build with the wgpu or cuda feature",
    )
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn row(mixer: &str, form: &str, steps: &[hla_model::bench::cost::Step], peaks: Peaks) -> CostRow {
    let mut parts: Vec<CostPart> = Vec::new();
    for step in steps {
        let (what, engine) = part_of(step);
        let ms = peaks.seconds(step) * 1e3;
        match parts
            .iter_mut()
            .find(|p| p.what == what && p.engine == engine)
        {
            Some(part) => {
                part.launches += step.launches;
                part.flops += step.flops;
                part.bytes += step.bytes;
                part.roofline_ms += ms;
            }
            None => parts.push(CostPart {
                what,
                engine,
                launches: step.launches,
                flops: step.flops,
                bytes: step.bytes,
                roofline_ms: ms,
            }),
        }
    }
    CostRow {
        mixer: mixer.into(),
        form: form.into(),
        launches: parts.iter().map(|p| p.launches).sum(),
        flops: parts.iter().map(|p| p.flops).sum(),
        bytes: parts.iter().map(|p| p.bytes).sum(),
        roofline_ms: parts.iter().map(|p| p.roofline_ms).sum(),
        parts,
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl Peaks {
    /// A step's roofline time: max(compute time, memory time), a hand-written kernel's
    /// compute at its cubes' share of the SMs.
    fn seconds(&self, step: &hla_model::bench::cost::Step) -> f64 {
        use hla_model::bench::cost::Engine;
        let share = |cubes: usize| (cubes as f64 / self.sms as f64).min(1.0);
        let compute = match step.engine {
            Engine::Matmul => self.tf32,
            Engine::Memory => self.fp32,
            Engine::Kernel { cubes } => self.fp32 * share(cubes),
            Engine::TensorKernel { cubes } => self.tf32 * share(cubes),
        };
        (step.flops / compute).max(step.bytes / self.bandwidth)
    }
}

/// What runs a step and on which engine, as [`CostPart`] names them.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn part_of(step: &hla_model::bench::cost::Step) -> (String, String) {
    use hla_model::bench::cost::Engine;
    let what = |burn: &str| step.kernel.clone().unwrap_or_else(|| burn.into());
    match step.engine {
        Engine::Matmul => (what("matmul"), "tensor cores".into()),
        Engine::Memory => (what("memory"), "memory-bound".into()),
        Engine::Kernel { cubes } => (what("kernel"), format!("cuda cores, {cubes} cubes")),
        Engine::TensorKernel { cubes } => (what("kernel"), format!("tensor cores, {cubes} cubes")),
    }
}

/// The cost model's table.
pub(super) fn render(md: &mut String, cost: &Cost) {
    let gates = super::gates_note(&cost.gates);
    let _ = writeln!(
        md,
        "## Cost model: forward+backward on an {} (B{} H{} T{} d{}, chunk {}, f32{gates})\n\n\
         | mixer | form | launches | GFLOP | GB moved | roofline ms |\n\
         |---|---|---:|---:|---:|---:|",
        cost.gpu, cost.batch, cost.heads, cost.time, cost.d, cost.chunk
    );
    for r in &cost.rows {
        let figures = figures(r.launches, r.flops, r.bytes, r.roofline_ms);
        let _ = writeln!(md, "| {} | {} | {figures} |", r.mixer, r.form);
    }
    let _ = writeln!(md);
    if cost.rows.iter().any(|r| !r.parts.is_empty()) {
        render_parts(md, cost);
    }
}

/// Where each form's roofline time goes: its steps by what runs them.
fn render_parts(md: &mut String, cost: &Cost) {
    let _ = writeln!(
        md,
        "### Where the time goes\n\n\
         Each form's steps by what runs them: a hand-written kernel (on the CUDA or tensor \
         cores with its cubes, or bound by memory), Burn's matmuls, or Burn's elementwise \
         ops, reductions and copies (`memory`).\n\n\
         | mixer | form | steps | engine | launches | GFLOP | GB moved | roofline ms |\n\
         |---|---|---|---|---:|---:|---:|---:|"
    );
    for r in &cost.rows {
        for p in &r.parts {
            let figures = figures(p.launches, p.flops, p.bytes, p.roofline_ms);
            let (what, engine) = (&p.what, &p.engine);
            let _ = writeln!(
                md,
                "| {} | {} | {what} | {engine} | {figures} |",
                r.mixer, r.form
            );
        }
    }
    let _ = writeln!(md);
}

/// Launches, GFLOP, GB moved and roofline ms as a table's cells.
fn figures(launches: usize, flops: f64, bytes: f64, roofline_ms: f64) -> String {
    let (gflop, gb) = (flops / 1e9, bytes / 1e9);
    format!("{launches} | {gflop:.2} | {gb:.3} | {roofline_ms:.3}")
}
