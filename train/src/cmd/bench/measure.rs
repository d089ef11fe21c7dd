//! What `hla bench` measures: the sections asked for, on the device and at the sizes its
//! arguments give.

use anyhow::Result;

use super::cost::{self, Cost};
use super::forms::Forms;
use super::operators::efficiency;
use super::{
    Args, Bench, Problem, Report, SEGMENT_SWEEP_TIME, SWEEP_CHUNKS, SWEEP_SEGMENTS, SWEEP_TIME,
    Section, shape,
};
use crate::run::devices;

pub(super) fn measure(args: &Args) -> Result<Report> {
    let device = devices::parse(&args.device)?;
    device.seed(args.seed);
    args.tensor_cores.apply();
    let bench = Bench {
        device,
        host_memory: args.device != "wgpu",
        problem: args.operator_shape,
        gates: args.gates,
    };
    let (chunk, segment) = (args.chunk as usize, args.segment as usize);
    let (times, positions) = lengths(args);
    let wanted =
        |s: Section| args.only.contains(&s) || (args.only.is_empty() && s != Section::Cost);
    let longest = *times.iter().max().expect("at least one length");
    let square = if args.quick { 512 } else { 1024 };
    // First: it needs a CubeCL device, which a mistaken call learns at once.
    let cost = match wanted(Section::Cost) {
        true => Some(cost_model(args, &bench, chunk)?),
        false => None,
    };
    let forms = Forms {
        all: args.composed,
        only: args.form.clone(),
    };
    let train = run_if(wanted(Section::Train), || {
        bench.train_steps(&args.mixer, &args.workload, &forms, args.quick)
    })?;
    let operators = run_if(wanted(Section::Operators), || {
        bench.operators(&args.operator, &times, chunk, segment, &forms)
    })?;
    let decode = run_if(wanted(Section::Decode), || bench.decode(positions))?;
    let matmul = run_if(wanted(Section::Matmul), || {
        bench.matmuls(square, longest, chunk)
    })?;
    let efficiency = efficiency(&operators, chunk, bench.problem);
    let chunk_sweep = run_if(wanted(Section::Sweep), || {
        bench.sweep(SWEEP_CHUNKS.map(|c| (SWEEP_TIME, c, segment)))
    })?;
    let segment_sweep = run_if(wanted(Section::Sweep), || {
        bench.sweep(SWEEP_SEGMENTS.map(|s| (SEGMENT_SWEEP_TIME, chunk, s)))
    })?;
    Ok(Report {
        device: args.device.clone(),
        quick: args.quick,
        chunk,
        segment,
        batch: bench.problem.batch,
        heads: bench.problem.heads,
        d: bench.problem.d,
        dv: bench.problem.d,
        gates: bench.gates.name().into(),
        tensor_cores: args.tensor_cores.on,
        train,
        operators,
        decode,
        matmul,
        efficiency,
        chunk_sweep,
        segment_sweep,
        cost,
    })
}

/// The operators' sequence lengths (`--time`'s in increasing order, else `--quick`'s or
/// the default's) and the decoding positions.
fn lengths(args: &Args) -> (Vec<usize>, &'static [usize]) {
    let mut chosen: Vec<usize> = args.times.iter().map(|&t| t as usize).collect();
    chosen.sort_unstable();
    chosen.dedup();
    let times = match (chosen.is_empty(), args.quick) {
        (false, _) => chosen,
        (true, true) => vec![256, 512, 1024, 2048],
        (true, false) => vec![256, 512, 1024, 2048, 4096, 8192],
    };
    let positions: &[usize] = match args.quick {
        true => &[64, 1024, 4096],
        false => &[64, 1024, 4096, 16384],
    };
    (times, positions)
}

/// The cost model at `--cost-shape` with chunks of `chunk`, of the mixers and forms asked
/// for.
fn cost_model(args: &Args, bench: &Bench, chunk: usize) -> Result<Cost> {
    let [batch, heads, time, d] = args.cost_shape;
    let problem = Problem { batch, heads, d };
    let only = cost::Selection {
        mixers: &args.mixer,
        forms: &args.cost_form,
    };
    let shape = shape(problem, time, chunk);
    cost::cost(&bench.device, (&shape, args.gates), args.gpu, only)
}

fn run_if<T>(wanted: bool, f: impl FnOnce() -> Result<Vec<T>>) -> Result<Vec<T>> {
    if wanted { f() } else { Ok(Vec::new()) }
}
