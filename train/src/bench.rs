//! `hla bench`: operator time and memory against sequence length, decode latency against
//! position, the chunked form's achieved GFLOP/s next to plain matmuls, and chunk-size and
//! segment-size sweeps. Every figure is the median of several timed repetitions after a warm-up.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use burn::prelude::*;
use hla_model::bench::{Operator, OperatorInputs, Shape5, advance, decode_model};
use hla_model::hla::Form;
use hla_model::lm::MixerKind;
use serde::{Deserialize, Serialize};

use crate::alloc;
use crate::plots::Series;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compute device: ndarray, flex or wgpu (if compiled in).
    #[arg(long, default_value = crate::device::default_name())]
    device: String,
    /// Print every figure as JSON on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Operators up to T = 2048 and decoding up to position 4096 (a few minutes).
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
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    /// Operator time and memory against sequence length.
    Operators,
    /// `Lm::step` latency against position.
    Decode,
    /// Plain matmul GFLOP/s (the chunked forms' GFLOP/s come with `operators`).
    Matmul,
    /// Chunk-size and segment-size sweeps of the second-order chunked form.
    Sweep,
}

/// Heads and widths of the operator problem (the B=1, H=4, d=dv=64).
const BATCH: usize = 1;
const HEADS: usize = 4;
const DIM: usize = 64;
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
struct OperatorRow {
    operator: String,
    time: usize,
    pass: String,
    tokens_per_s: f64,
    timing: Timing,
}

#[derive(Debug, Serialize, Deserialize)]
struct DecodeRow {
    mixer: String,
    position: usize,
    state_bytes: usize,
    timing: Timing,
}

#[derive(Debug, Serialize, Deserialize)]
struct MatmulRow {
    name: String,
    gflop: f64,
    gflops: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct EfficiencyRow {
    operator: String,
    time: usize,
    gflop: f64,
    gflops: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct SweepRow {
    chunk: usize,
    segment: usize,
    time: usize,
    pass: String,
    timing: Timing,
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
    operators: Vec<OperatorRow>,
    decode: Vec<DecodeRow>,
    matmul: Vec<MatmulRow>,
    efficiency: Vec<EfficiencyRow>,
    chunk_sweep: Vec<SweepRow>,
    segment_sweep: Vec<SweepRow>,
}

pub fn run(args: &Args) -> Result<()> {
    let report = match &args.replot {
        Some(path) => read_report(path)?,
        None => measure(args)?,
    };
    let json = serde_json::to_string_pretty(&report)?;
    let tables = render(&report);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        crate::run_dir::write_atomic(&dir.join("bench.json"), json.as_bytes())?;
        crate::run_dir::write_atomic(&dir.join("bench.md"), tables.as_bytes())?;
        if !report.operators.is_empty() {
            plot_times(dir, &report.operators)?;
        }
    }
    println!("{}", if args.json { &json } else { &tables });
    Ok(())
}

fn read_report(path: &std::path::Path) -> Result<Report> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))
        .map_err(crate::config::UsageError::from)?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a bench.json of this version", path.display()))
        .map_err(|e| crate::config::UsageError::from(e).into())
}

fn measure(args: &Args) -> Result<Report> {
    let device = crate::device::parse(&args.device)?;
    device.seed(args.seed);
    let host_memory = args.device != "wgpu";
    let bench = Bench {
        device: device.clone(),
        host_memory,
    };
    let (chunk, segment) = (args.chunk as usize, args.segment as usize);
    let times: &[usize] = if args.quick {
        &[256, 512, 1024, 2048]
    } else {
        &[256, 512, 1024, 2048, 4096, 8192]
    };
    let positions: &[usize] = if args.quick {
        &[64, 1024, 4096]
    } else {
        &[64, 1024, 4096, 16384]
    };

    let wanted = |s: Section| args.only.is_empty() || args.only.contains(&s);
    let longest = *times.last().expect("at least one length");
    let square = if args.quick { 512 } else { 1024 };
    let operators = run_if(wanted(Section::Operators), || {
        bench.operators(times, chunk, segment)
    })?;
    let decode = run_if(wanted(Section::Decode), || bench.decode(positions))?;
    let matmul = run_if(wanted(Section::Matmul), || {
        bench.matmuls(square, longest, chunk)
    })?;
    let efficiency = efficiency(&operators, chunk);
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
        batch: BATCH,
        heads: HEADS,
        d: DIM,
        dv: DIM,
        operators,
        decode,
        matmul,
        efficiency,
        chunk_sweep,
        segment_sweep,
    })
}

fn run_if<T>(wanted: bool, f: impl FnOnce() -> Result<Vec<T>>) -> Result<Vec<T>> {
    if wanted { f() } else { Ok(Vec::new()) }
}

struct Bench {
    device: Device,
    host_memory: bool,
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

    /// Every operator, pass and length: one warm-up each, then rounds that run every case
    /// still short of its repetitions, so that the machine's slow spells spread over all
    /// cases (and both ends of a ratio) instead of landing on a few.
    fn operators(&self, times: &[usize], chunk: usize, segment: usize) -> Result<Vec<OperatorRow>> {
        let form = Form::passes(chunk, segment);
        let autodiff = self.device.clone().autodiff();
        let inputs: Vec<_> = times
            .iter()
            .map(|&time| {
                let shape = shape(time, chunk);
                let x = OperatorInputs::random(&shape, &self.device);
                (x, OperatorInputs::random(&shape, &autodiff))
            })
            .collect();
        // (operator, index of the length, with backward)
        let mut cases = Vec::new();
        for (i, &time) in times.iter().enumerate() {
            for op in Operator::ALL {
                cases.push((op, i, false));
                if op != Operator::Hla2Recurrent || time <= RECURRENT_BACKWARD_MAX {
                    cases.push((op, i, true));
                }
            }
        }
        // Seconds and peak heap bytes of one call.
        let once = |&(op, i, backward): &(Operator, usize, bool)| -> Result<(f64, usize)> {
            let (x, x_grad) = &inputs[i];
            let base = alloc::reset_peak();
            let start = Instant::now();
            if backward {
                drop(x_grad.forward_backward(op, form));
            } else {
                drop(x.forward(op, form));
            }
            self.device.sync().context("waiting for the device")?;
            Ok((start.elapsed().as_secs_f64(), alloc::peak() - base))
        };
        let mut reps = Vec::with_capacity(cases.len());
        for case in &cases {
            eprintln!("operator {} T={} warm-up", case.0.name(), times[case.1]);
            reps.push(repetitions(once(case)?.0));
        }
        let rounds = reps.iter().copied().max().unwrap_or(0);
        let mut runs = vec![Vec::new(); cases.len()];
        let mut peaks = vec![0; cases.len()];
        for round in 0..rounds {
            eprintln!("operators: round {} of {rounds}", round + 1);
            for (c, case) in cases.iter().enumerate() {
                if round < reps[c] {
                    let (seconds, peak) = once(case)?;
                    runs[c].push(seconds);
                    peaks[c] = peaks[c].max(peak);
                }
            }
        }
        let rows = cases.iter().zip(runs).zip(peaks);
        Ok(rows
            .map(|((&(op, i, backward), runs), peak)| {
                let pass = if backward {
                    "forward+backward"
                } else {
                    "forward"
                };
                let timing = Timing::of(runs, self.host_memory.then_some(peak));
                operator_row(op, times[i], pass, timing)
            })
            .collect())
    }

    /// `Lm::step` latency at every position: one state per position (prefilled), then
    /// [`DECODE_ROUNDS`] rounds of one token at each position after a warm-up round.
    fn decode(&self, positions: &[usize]) -> Result<Vec<DecodeRow>> {
        let last = *positions.last().expect("at least one position");
        let mut rows = Vec::new();
        for mixer in [MixerKind::Hla2, MixerKind::Linear, MixerKind::Softmax] {
            let lm = decode_model(mixer, last + DECODE_ROUNDS + 1, &self.device);
            let token = Tensor::<1, Int>::zeros([1], &self.device);
            let mut state = lm.init_state(1);
            let mut states = Vec::with_capacity(positions.len());
            for &position in positions {
                eprintln!("decode {} prefill to {position}", mixer.name());
                advance(&lm, &mut state, position, PREFILL_PIECE, &self.device);
                states.push(state.clone());
            }
            drop(state);
            let mut runs = vec![Vec::with_capacity(DECODE_ROUNDS); positions.len()];
            for round in 0..=DECODE_ROUNDS {
                for (state, runs) in states.iter_mut().zip(&mut runs) {
                    let start = Instant::now();
                    drop(lm.step(token.clone(), state));
                    self.device.sync().context("waiting for the device")?;
                    if round > 0 {
                        runs.push(start.elapsed().as_secs_f64());
                    }
                }
            }
            for (&position, runs) in positions.iter().zip(runs) {
                rows.push(DecodeRow {
                    mixer: mixer.name().into(),
                    position,
                    state_bytes: lm.state_size(position) * lm.num_layers() * size_of::<f32>(),
                    timing: Timing::of(runs, None),
                });
            }
        }
        Ok(rows)
    }

    /// A square `n³` matmul and the batched chunk-shaped `Q Kᵀ` of the longest sequence,
    /// the two references for the chunked form's GFLOP/s.
    fn matmuls(&self, n: usize, time: usize, chunk: usize) -> Result<Vec<MatmulRow>> {
        let chunks = HEADS * time.div_ceil(chunk);
        let cases = [
            (format!("square {n}×{n}×{n}"), [1, 1, n, n, n]),
            (
                format!("chunk-shaped {chunks}×({chunk}×{DIM}×{chunk})"),
                [1, chunks, chunk, DIM, chunk],
            ),
        ];
        let mut rows = Vec::new();
        for (name, [b, h, m, k, n]) in cases {
            eprintln!("matmul {name}");
            let uniform = burn::tensor::Distribution::Uniform(-1.0, 1.0);
            let lhs = Tensor::<4>::random([b, h, m, k], uniform, &self.device);
            let rhs = Tensor::<4>::random([b, h, k, n], uniform, &self.device);
            let timing = self.time(|| drop(lhs.clone().matmul(rhs.clone())))?;
            let gflop = 2.0 * (b * h * m * k * n) as f64 / 1e9;
            rows.push(MatmulRow {
                name,
                gflop,
                gflops: gflop / timing.median_s,
            });
        }
        Ok(rows)
    }

    /// [`Self::sweep_point`] at every `(time, chunk, segment)`.
    fn sweep(
        &self,
        points: impl IntoIterator<Item = (usize, usize, usize)>,
    ) -> Result<Vec<SweepRow>> {
        let mut rows = Vec::new();
        for (time, chunk, segment) in points {
            eprintln!("sweep T={time}, chunk {chunk}, {}", passes(segment));
            rows.extend(self.sweep_point(time, chunk, segment)?);
        }
        Ok(rows)
    }

    /// hla2-chunked forward and forward+backward at one chunk and segment size.
    fn sweep_point(&self, time: usize, chunk: usize, segment: usize) -> Result<[SweepRow; 2]> {
        let shape = shape(time, chunk);
        let x = OperatorInputs::random(&shape, &self.device);
        let x_grad = OperatorInputs::random(&shape, &self.device.clone().autodiff());
        let (op, form) = (Operator::Hla2Chunked, Form::passes(chunk, segment));
        let row = |pass: &str, timing| SweepRow {
            chunk,
            segment,
            time,
            pass: pass.into(),
            timing,
        };
        Ok([
            row("forward", self.time(|| drop(x.forward(op, form)))?),
            row(
                "forward+backward",
                self.time(|| drop(x_grad.forward_backward(op, form)))?,
            ),
        ])
    }
}

fn shape(time: usize, chunk: usize) -> Shape5 {
    Shape5 {
        batch: BATCH,
        heads: HEADS,
        time,
        d: DIM,
        dv: DIM,
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

/// Repetitions for about [`BUDGET_S`] of calls taking `warm` seconds, 3 to 15.
fn repetitions(warm: f64) -> usize {
    ((BUDGET_S / warm.max(1e-6)) as usize).clamp(3, 15)
}

fn operator_row(op: Operator, time: usize, pass: &'static str, timing: Timing) -> OperatorRow {
    OperatorRow {
        operator: op.name().into(),
        time,
        pass: pass.into(),
        tokens_per_s: (BATCH * time) as f64 / timing.median_s,
        timing,
    }
}

/// Median time against T, one line per operator and pass, log-log.
fn plot_times(dir: &std::path::Path, rows: &[OperatorRow]) -> Result<()> {
    let mut series: Vec<Series> = Vec::new();
    for r in rows {
        let name = format!("{} {}", r.operator, r.pass);
        let point = (r.time as f64, r.timing.median_s * 1e3);
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                name,
                points: vec![point],
            }),
        }
    }
    let axes = ("sequence length T (log)", "median time, ms (log)");
    crate::plots::log_log(
        dir,
        "time-vs-T",
        "time against sequence length",
        axes,
        &series,
    )?;
    Ok(())
}

/// Achieved GFLOP/s of the chunked forms' forward passes.
fn efficiency(rows: &[OperatorRow], chunk: usize) -> Vec<EfficiencyRow> {
    rows.iter()
        .filter(|r| r.pass == "forward")
        .filter_map(|r| {
            let op = *Operator::ALL.iter().find(|op| op.name() == r.operator)?;
            let gflop = op.chunked_flops(&shape(r.time, chunk))? / 1e9;
            Some(EfficiencyRow {
                operator: r.operator.clone(),
                time: r.time,
                gflop,
                gflops: gflop / r.timing.median_s,
            })
        })
        .collect()
}

/// The median time of `operator`'s `pass` at `time`.
fn median(report: &Report, operator: &str, pass: &str, time: usize) -> Option<f64> {
    report
        .operators
        .iter()
        .find(|r| r.operator == operator && r.pass == pass && r.time == time)
        .map(|r| r.timing.median_s)
}

fn render(report: &Report) -> String {
    let mut md = String::new();
    let passes = passes(report.segment);
    let _ = writeln!(
        md,
        "# hla bench on {} (B={}, H={}, d=dv={}, chunk {}, {passes})\n",
        report.device, report.batch, report.heads, report.d, report.chunk
    );
    render_operators(&mut md, report);
    render_decode(&mut md, report);
    render_efficiency(&mut md, report);
    render_sweep(&mut md, report);
    md
}

fn render_operators(md: &mut String, report: &Report) {
    let _ = writeln!(
        md,
        "## Operators: median time (ms), tokens/s, peak heap\n\n\
         | operator | pass | T | ms | tokens/s | peak MiB |\n|---|---|---:|---:|---:|---:|"
    );
    for r in &report.operators {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.0} | {} |",
            r.operator,
            r.pass,
            r.time,
            r.timing.median_s * 1e3,
            r.tokens_per_s,
            mib(r.timing.peak_bytes)
        );
    }
    let _ = writeln!(
        md,
        "\nhla2-recurrent forward+backward is timed up to T={RECURRENT_BACKWARD_MAX} only: \
         its backward pass grows quadratically with T (training uses the chunked form)."
    );
    let times: Vec<usize> = report
        .operators
        .iter()
        .map(|r| r.time)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let (first, last) = (1024, *times.last().unwrap_or(&1024));
    let _ = writeln!(
        md,
        "\nScaling, forward+backward time at T={last} over T={first} (linear: {}):\n",
        last / first
    );
    for op in Operator::ALL {
        let pass = "forward+backward";
        if let (Some(a), Some(b)) = (
            median(report, op.name(), pass, first),
            median(report, op.name(), pass, last),
        ) {
            let _ = writeln!(md, "- {}: {:.2}", op.name(), b / a);
        }
    }
    let _ = writeln!(
        md,
        "\nSoftmax over hla2-chunked, forward+backward time (> 1: HLA faster):\n"
    );
    for &t in &times {
        let pass = "forward+backward";
        if let (Some(s), Some(h)) = (
            median(report, Operator::Softmax.name(), pass, t),
            median(report, Operator::Hla2Chunked.name(), pass, t),
        ) {
            let _ = writeln!(md, "- T={t}: {:.2}", s / h);
        }
    }
}

fn render_decode(md: &mut String, report: &Report) {
    let _ = writeln!(
        md,
        "\n## Decoding: `Lm::step` latency (d_model 128, 4 layers)\n\n\
         | mixer | position | µs/token | state bytes |\n|---|---:|---:|---:|"
    );
    for r in &report.decode {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} |",
            r.mixer,
            r.position,
            r.timing.median_s * 1e6,
            r.state_bytes
        );
    }
    let _ = writeln!(md, "\nLatency at the last position over position 64:\n");
    for mixer in ["hla2", "linear", "softmax"] {
        let rows: Vec<&DecodeRow> = report.decode.iter().filter(|r| r.mixer == mixer).collect();
        if let (Some(a), Some(b)) = (rows.first(), rows.last()) {
            let _ = writeln!(
                md,
                "- {mixer}: {:.2} (state {} → {} bytes)",
                b.timing.median_s / a.timing.median_s,
                a.state_bytes,
                b.state_bytes
            );
        }
    }
}

fn render_efficiency(md: &mut String, report: &Report) {
    if report.efficiency.is_empty() && report.matmul.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Efficiency: chunked forward GFLOP/s (matmul FLOPs of spec §5)"
    );
    if !report.efficiency.is_empty() {
        let _ = writeln!(
            md,
            "\n| operator | T | GFLOP | GFLOP/s |\n|---|---:|---:|---:|"
        );
    }
    for r in &report.efficiency {
        let _ = writeln!(
            md,
            "| {} | {} | {:.3} | {:.1} |",
            r.operator, r.time, r.gflop, r.gflops
        );
    }
    if !report.matmul.is_empty() {
        let _ = writeln!(md, "\nPlain matmuls on the same device:\n");
    }
    for m in &report.matmul {
        let _ = writeln!(md, "- {}: {:.1} GFLOP/s", m.name, m.gflops);
    }
}

fn render_sweep(md: &mut String, report: &Report) {
    let sweeps = [
        ("chunk", SWEEP_TIME, &report.chunk_sweep),
        ("segment", SEGMENT_SWEEP_TIME, &report.segment_sweep),
    ];
    for (name, time, rows) in sweeps {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "\n## {name} size sweep: hla2-chunked at T={time} (ms)\n\n\
             | chunk | passes | forward | forward+backward |\n|---:|---|---:|---:|"
        );
        for pair in rows.chunks(2) {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {:.2} |",
                pair[0].chunk,
                passes(pair[0].segment),
                pair[0].timing.median_s * 1e3,
                pair[1].timing.median_s * 1e3
            );
        }
    }
}

fn mib(bytes: Option<usize>) -> String {
    bytes.map_or("n/a".into(), |b| format!("{:.1}", b as f64 / 1048576.0))
}
