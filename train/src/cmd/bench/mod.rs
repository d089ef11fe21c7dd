//! `hla bench`: whole training steps of every mixer, operator time and memory against
//! sequence length, decode latency against position, the chunked form's achieved GFLOP/s
//! next to plain matmuls, and chunk-size and segment-size sweeps. Every figure is the median
//! of several timed repetitions after a warm-up. Asked for, the cost model of the GPU forms.

mod cost;
mod decode;
mod forms;
mod launches;
mod matmul;
mod measure;
mod operators;
mod render;
mod steps;
mod sweep;
mod workloads;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::prelude::*;
use hla_model::bench::{Gating, Operator, Shape5};
use hla_model::lm::MixerKind;
use serde::{Deserialize, Serialize};

use crate::alloc;
use crate::cmd::forms::TensorCoresArg;
use crate::run::devices;
use crate::run::run_dir::write_atomic;
use crate::run::usage::UsageError;
use cost::{Cost, CostForm, Gpu};
use decode::DecodeRow;
use forms::{Forms, Route};
use matmul::MatmulRow;
use operators::{EfficiencyRow, OperatorRow};
use render::{plot_times, render};
use steps::TrainRow;
use sweep::SweepRow;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compute device: flex, ndarray or wgpu (if compiled in).
    #[arg(long, default_value = devices::default_name())]
    device: String,
    /// Print every figure as JSON on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Operators up to T = 2048, decoding up to position 4096 and 3 training steps per
    /// case (a few minutes).
    #[arg(long)]
    quick: bool,
    /// Chunk size of the chunked forms (the sweep measures the others).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
    /// Most tokens per chunk-parallel pass, 0: one pass (the language model's
    /// `segment_size`; the sweep measures the others).
    #[arg(long, default_value_t = 0)]
    segment: u32,
    /// Also write `bench.json` and `bench.md` into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only these sections (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    /// Render the tables and chart of an earlier `bench.json` instead of measuring.
    #[arg(long, value_name = "BENCH_JSON", conflicts_with_all = ["quick", "only"])]
    replot: Option<PathBuf>,
    /// Seed of the random inputs and weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also measure every training step and operator with the fused kernels off (their
    /// composed forms), and every HLA mixer's step and chunked operator as its node (one
    /// autodiff node of Burn's ops with a hand-written backward pass), in the same rounds:
    /// the CPU kernels, or on a GPU the chunked HLA's and the attention's. The fused rows
    /// run every kernel, the GPU kernels too, which training leaves off (measured slower
    /// than the composed forms on an H200).
    #[arg(long)]
    composed: bool,
    /// Train and operators sections: only these forms of each case, where it has them:
    /// `fused` (the hand-written kernels), `node` (the chunked HLA's node) and `composed`
    /// (without it, those `--composed` measures).
    #[arg(long, value_enum, value_delimiter = ',')]
    form: Vec<Route>,
    /// Operators, matmul and sweep sections: batch, heads and head width of the operator
    /// problem, `B,H,D` (`d = dv`; the default is the figures' shape so far; e.g. `4,16,128` for
    /// flash-linear-attention's published chunk_gla figure).
    #[arg(long, value_name = "B,H,D", default_value = "1,4,64", value_parser = parse_problem)]
    operator_shape: Problem,
    /// Operators, sweep and cost sections: the operators' gates, `fixed` (the language model's
    /// default multi-scale decay, which needs no gradient) or `data` (data-dependent gates
    /// with their gradient, as the `gated` decay has).
    #[arg(long, default_value = "fixed", value_parser = parse_gates)]
    gates: Gating,
    /// Operators section: only these operators (default: all; the serial recurrence's
    /// backward is the slow one on a GPU).
    #[arg(long, value_delimiter = ',', value_parser = parse_operator)]
    operator: Vec<Operator>,
    /// Operators section: these sequence lengths instead of `--quick`'s or the default's
    /// (the matmul section's longest then follows the longest of them).
    #[arg(long = "time", value_name = "T", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..))]
    times: Vec<u32>,
    /// Train and cost sections: only these mixers (default: all).
    #[arg(long, value_delimiter = ',', value_parser = parse_mixer)]
    mixer: Vec<MixerKind>,
    /// Train section: only these workloads, `nanogpt` (batch 12 of 64 tokens, vocabulary
    /// 65), `long` (one sequence of 2048), `gpt2-small` (GPT-2's vocabulary and recipe,
    /// width 256, 4 layers, batch 16 of 256), `wide` (the same at width 512, 8 layers, 8
    /// heads, batch 8 of 512) or `gutenberg` (the Gutenberg study's model: vocabulary 8192,
    /// width 256, 4 layers, batch 8 of 512, and its two hybrids) (default: all).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(workloads::WORKLOAD_NAMES))]
    workload: Vec<String>,
    /// Cost section: batch, heads, sequence length and head width, `B,H,T,D` (`d = dv`;
    /// the default is flash-linear-attention's benchmark shape); the chunk is `--chunk`.
    #[arg(long, value_name = "B,H,T,D", default_value = "4,16,2048,128", value_parser = parse_cost_shape)]
    cost_shape: [usize; 4],
    /// Cost section: the GPU whose peaks the roofline uses (every form plans its tiles
    /// for its shared memory).
    #[arg(long, value_enum, default_value = "h200")]
    gpu: Gpu,
    /// Cost section: only these forms (default: all). At flash-linear-attention's shape
    /// `node` alone reads in minutes on lavapipe; the other forms' matmuls are autotuned
    /// at full size on the CPU first.
    #[arg(long, value_enum, value_delimiter = ',')]
    cost_form: Vec<CostForm>,
    #[command(flatten)]
    tensor_cores: TensorCoresArg,
}

fn parse_mixer(name: &str) -> Result<MixerKind, String> {
    name.parse()
}

fn parse_gates(name: &str) -> Result<Gating, String> {
    name.parse()
}

fn parse_operator(name: &str) -> Result<Operator, String> {
    name.parse()
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    /// Whole optimizer steps of every mixer (nanoGPT's CPU configuration, a long context,
    /// GPT-2's vocabulary at two sizes).
    Train,
    /// Operator time and memory against sequence length.
    Operators,
    /// `Lm::step` latency against position.
    Decode,
    /// Plain matmul GFLOP/s (the chunked forms' GFLOP/s come with `operators`).
    Matmul,
    /// Chunk-size and segment-size sweeps of the second-order chunked form.
    Sweep,
    /// The cost model of the GPU forms (only when asked; on a wgpu or cuda device).
    Cost,
}

/// The operator problem: batch, heads and head width (`d = dv`).
#[derive(Clone, Copy, Debug)]
struct Problem {
    batch: usize,
    heads: usize,
    d: usize,
}

/// `B,H,D` of `--operator-shape`, each at least 1.
fn parse_problem(text: &str) -> Result<Problem, String> {
    let [batch, heads, d] = positive(text, "three", "B,H,D")?;
    Ok(Problem { batch, heads, d })
}

/// `B,H,T,D` of `--cost-shape`, each at least 1.
fn parse_cost_shape(text: &str) -> Result<[usize; 4], String> {
    positive(text, "four", "B,H,T,D")
}

/// `N` comma-separated positive integers.
fn positive<const N: usize>(text: &str, count: &str, names: &str) -> Result<[usize; N], String> {
    let wrong = || format!("`{text}` is not {count} positive integers {names}");
    let sizes: Vec<usize> = text
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or_else(wrong)?;
    sizes.try_into().map_err(|_| wrong())
}
/// Decoding positions: KV caches this long, prefilled this many tokens at a time.
const PREFILL_PIECE: usize = 1024;
const SWEEP_CHUNKS: [usize; 5] = [16, 32, 64, 128, 256];
const SWEEP_TIME: usize = 2048;
/// Segment sizes swept at [`SEGMENT_SWEEP_TIME`]; the last is the whole sequence in one pass.
const SWEEP_SEGMENTS: [usize; 6] = [256, 512, 1024, 2048, 4096, 8192];
const SEGMENT_SWEEP_TIME: usize = 8192;
/// The serial recurrence's backward pass grows quadratically with T (4× per doubling
/// measured: each token is a slice of the whole sequence, and Burn's autodiff gives every
/// slice a full-length gradient); it is timed up to this length only (training uses the
/// chunked form).
const RECURRENT_BACKWARD_MAX: usize = 2048;
/// Time spent on the repetitions of one figure, past the warm-up.
const BUDGET_S: f64 = 2.0;
/// Tokens decoded at each position, one position after another in rounds, so that the
/// machine's slow spells fall on every position alike; positions drift by this much.
const DECODE_ROUNDS: usize = 31;

#[derive(Debug, Serialize, Deserialize)]
struct Timing {
    median_s: f64,
    min_s: f64,
    reps: usize,
    /// Peak host heap bytes above the start of the call (CPU devices only).
    peak_bytes: Option<usize>,
}

impl Timing {
    fn of(mut runs: Vec<f64>, peak_bytes: Option<usize>) -> Self {
        runs.sort_by(f64::total_cmp);
        Self {
            median_s: runs[runs.len() / 2],
            min_s: runs[0],
            reps: runs.len(),
            peak_bytes,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Report {
    device: String,
    quick: bool,
    chunk: usize,
    segment: usize,
    batch: usize,
    heads: usize,
    d: usize,
    dv: usize,
    /// The operators' gates ([`Gating`]'s name; reports written before the option say
    /// none: theirs were fixed).
    #[serde(default = "fixed_gates")]
    gates: String,
    /// Whether the tile products ran on the tensor cores where the device has them
    /// (reports written before the option say none: they had no such kernels).
    #[serde(default = "tensor_cores_on")]
    tensor_cores: bool,
    /// Absent in reports written before the section existed.
    #[serde(default)]
    train: Vec<TrainRow>,
    operators: Vec<OperatorRow>,
    decode: Vec<DecodeRow>,
    matmul: Vec<MatmulRow>,
    efficiency: Vec<EfficiencyRow>,
    chunk_sweep: Vec<SweepRow>,
    segment_sweep: Vec<SweepRow>,
    /// Absent unless asked for (and in reports written before the section existed).
    #[serde(default)]
    cost: Option<Cost>,
}

pub fn run(args: &Args) -> Result<()> {
    let report = match &args.replot {
        Some(path) => read_report(path)?,
        None => measure::measure(args)?,
    };
    let json = serde_json::to_string_pretty(&report)?;
    let tables = render(&report);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_atomic(&dir.join("bench.json"), json.as_bytes())?;
        write_atomic(&dir.join("bench.md"), tables.as_bytes())?;
        if report
            .operators
            .iter()
            .any(|r| r.time != report.operators[0].time)
        {
            plot_times(dir, &report.operators)?;
        }
    }
    println!("{}", if args.json { &json } else { &tables });
    Ok(())
}

fn read_report(path: &std::path::Path) -> Result<Report> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))
        .map_err(UsageError::from)?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a bench.json of this version", path.display()))
        .map_err(|e| UsageError::from(e).into())
}

struct Bench {
    device: Device,
    host_memory: bool,
    problem: Problem,
    gates: Gating,
}

fn fixed_gates() -> String {
    Gating::Fixed.name().into()
}

fn tensor_cores_on() -> bool {
    true
}

/// What a header says of the gates named `gates` ([`hla_model::bench::Gating`]'s names):
/// nothing of the default.
fn gates_note(gates: &str) -> &'static str {
    match gates {
        "data" => ", data-dependent gates",
        _ => "",
    }
}

/// What a header says of the tensor cores: nothing of the default.
fn tensor_cores_note(on: bool) -> &'static str {
    match on {
        true => "",
        false => ", tensor cores off",
    }
}

impl Bench {
    /// Runs `f` once to warm up, then repeatedly for about [`BUDGET_S`] (3 to 15 times),
    /// waiting for the device after each run.
    fn time(&self, mut f: impl FnMut()) -> Result<Timing> {
        let mut once = || -> Result<f64> {
            let start = Instant::now();
            f();
            self.device.sync().context("waiting for the device")?;
            Ok(start.elapsed().as_secs_f64())
        };
        let reps = repetitions(once()?);
        let base = alloc::reset_peak();
        let runs = (0..reps).map(|_| once()).collect::<Result<Vec<_>>>()?;
        let peak = alloc::peak() - base;
        Ok(Timing::of(runs, self.host_memory.then_some(peak)))
    }
}

fn shape(problem: Problem, time: usize, chunk: usize) -> Shape5 {
    Shape5 {
        batch: problem.batch,
        heads: problem.heads,
        time,
        d: problem.d,
        dv: problem.d,
        chunk,
    }
}

/// How a chunked form is computed: "one pass" for segment 0, else "passes of N".
fn passes(segment: usize) -> String {
    match segment {
        0 => "one pass".into(),
        n => format!("passes of {n}"),
    }
}

/// Runs case `c` `reps[c]` times with `run`, in rounds of one run of every case still short
/// of its repetitions, so that the machine's slow spells spread over all cases (and both
/// ends of a ratio) instead of landing on a few; returns each case's results and its peak
/// heap bytes (the second of what `run` returns).
fn in_rounds<R>(
    section: &str,
    reps: &[usize],
    mut run: impl FnMut(usize) -> Result<(R, usize)>,
) -> Result<Vec<(Vec<R>, usize)>> {
    let rounds = reps.iter().copied().max().unwrap_or(0);
    let mut measured: Vec<(Vec<R>, usize)> = reps.iter().map(|_| (Vec::new(), 0)).collect();
    for round in 0..rounds {
        eprintln!("{section}: round {} of {rounds}", round + 1);
        for (c, &wanted) in reps.iter().enumerate() {
            if round < wanted {
                let (result, peak) = run(c)?;
                measured[c].0.push(result);
                measured[c].1 = measured[c].1.max(peak);
            }
        }
    }
    Ok(measured)
}

/// Repetitions for about [`BUDGET_S`] of calls taking `warm` seconds, 3 to 15.
fn repetitions(warm: f64) -> usize {
    ((BUDGET_S / warm.max(1e-6)) as usize).clamp(3, 15)
}
