//! The tables (`bench.md`) and the chart of a report.

use std::fmt::Write as _;

use anyhow::Result;
use hla_model::bench::Operator;

use super::decode::DecodeRow;
use super::operators::OperatorRow;
use super::steps::TrainRow;
use super::{RECURRENT_BACKWARD_MAX, Report, Route, SEGMENT_SWEEP_TIME, SWEEP_TIME, passes};
use crate::run::plots::{self, Series, YScale};

/// Median time against T, one line per operator and pass, log-log.
pub(super) fn plot_times(dir: &std::path::Path, rows: &[OperatorRow]) -> Result<()> {
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
    plots::log_x(
        dir,
        "time-vs-T",
        "time against sequence length",
        axes,
        &series,
        YScale::Log,
    )?;
    Ok(())
}

/// The median time of `operator`'s `pass` at `time`.
pub(super) fn median(report: &Report, operator: &str, pass: &str, time: usize) -> Option<f64> {
    report
        .operators
        .iter()
        .find(|r| r.operator == operator && r.pass == pass && r.time == time)
        .map(|r| r.timing.median_s)
}

pub(super) fn render(report: &Report) -> String {
    let mut md = String::new();
    let passes = passes(report.segment);
    // The cost model states its own shape; the problem here is the timed sections'.
    let gates = super::gates_note(&report.gates);
    let cores = super::tensor_cores_note(report.tensor_cores);
    let _ = match timed(report) {
        true => writeln!(
            md,
            "# hla bench on {} (B={}, H={}, d=dv={}, chunk {}, {passes}{gates}{cores})\n",
            report.device, report.batch, report.heads, report.d, report.chunk
        ),
        false => match report.tensor_cores {
            true => writeln!(md, "# hla bench on {}\n", report.device),
            false => writeln!(md, "# hla bench on {} (tensor cores off)\n", report.device),
        },
    };
    render_train(&mut md, report);
    render_operators(&mut md, report);
    render_decode(&mut md, report);
    render_efficiency(&mut md, report);
    render_sweep(&mut md, report);
    if let Some(cost) = &report.cost {
        super::cost::render(&mut md, cost);
    }
    md
}

/// Whether the report holds a timed section (any but the cost model).
/// Whether a section timed on the operator problem ran (the train section states each
/// workload's shape in its rows).
fn timed(report: &Report) -> bool {
    !(report.operators.is_empty()
        && report.decode.is_empty()
        && report.matmul.is_empty()
        && report.efficiency.is_empty()
        && report.chunk_sweep.is_empty()
        && report.segment_sweep.is_empty())
}

fn render_train(md: &mut String, report: &Report) {
    if report.train.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Training steps: forward, backward, clipping, AdamW (median ms per step and phase)\n\n\
         | workload | mixer | B×T | vocab | parameters | kernels | ms/step | forward | backward | optimizer | steps/s | tokens/s | peak MiB | launches |\n\
         |---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in &report.train {
        let _ = writeln!(
            md,
            "| {} | {} | {}×{} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0} | {} | {} |",
            r.workload,
            r.mixer,
            r.batch,
            r.context,
            r.vocab,
            r.parameters,
            r.route().form(),
            r.timing.median_s * 1e3,
            r.phases_s[0] * 1e3,
            r.phases_s[1] * 1e3,
            r.phases_s[2] * 1e3,
            r.steps_per_s,
            r.tokens_per_s,
            mib(r.timing.peak_bytes),
            r.launches.map_or("–".into(), |n| n.to_string())
        );
    }
    for (route, title) in [(Route::Kernels, "Fused kernels"), (Route::Node, "Nodes")] {
        render_over_composed(md, report, route, title);
    }
    let _ = writeln!(md);
}

/// Each training step of `route` over the same step composed, in tokens/s.
fn render_over_composed(md: &mut String, report: &Report, route: Route, title: &str) {
    let composed = |f: &TrainRow| {
        report.train.iter().find(|c| {
            c.route() == Route::Composed && c.workload == f.workload && c.mixer == f.mixer
        })
    };
    let pairs: Vec<_> = report
        .train
        .iter()
        .filter(|r| r.route() == route)
        .filter_map(|f| Some((f, composed(f)?)))
        .collect();
    if !pairs.is_empty() {
        let _ = writeln!(md, "\n{title} over composed forms, tokens/s:\n");
    }
    for (f, c) in pairs {
        let ratio = f.tokens_per_s / c.tokens_per_s;
        let _ = writeln!(md, "- {} {}: {ratio:.2}×", f.workload, f.mixer);
    }
}

fn render_operators(md: &mut String, report: &Report) {
    if report.operators.is_empty() {
        return;
    }
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
    render_fused_over_composed(md, report, &times);
    let (first, last) = (1024, *times.last().unwrap_or(&1024));
    if times.contains(&first) && last > first {
        render_scaling(md, report, first, last);
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

/// Each operator's composed form's and node's time over its kernels' (`--composed`): the
/// form the device should run.
fn render_fused_over_composed(md: &mut String, report: &Report, times: &[usize]) {
    let mut lines = Vec::new();
    for op in Operator::ALL {
        let of = |suffix: &str, pass, t| median(report, &format!("{}{suffix}", op.name()), pass, t);
        for pass in ["forward", "forward+backward"] {
            for &t in times {
                let Some(kernels) = of("", pass, t) else {
                    continue;
                };
                let (node, composed) = (of(" node", pass, t), of(" composed", pass, t));
                if node.is_none() && composed.is_none() {
                    continue;
                }
                let ratio = |x: Option<f64>| x.map_or("".into(), |x| format!("{:.2}", x / kernels));
                let fastest = [
                    ("kernels", Some(kernels)),
                    ("node", node),
                    ("composed", composed),
                ]
                .into_iter()
                .filter_map(|(name, s)| Some((name, s?)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map_or("", |(name, _)| name);
                lines.push(format!(
                    "| {} | {pass} | {t} | {} | {} | {fastest} |",
                    op.name(),
                    ratio(composed),
                    ratio(node),
                ));
            }
        }
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nKernels against the composed forms and the nodes: their time over the kernels' \
         (> 1: the kernels are faster)\n\n| operator | pass | T | composed / kernels | \
         node / kernels | fastest |\n|---|---|---:|---:|---:|---|"
    );
    for line in lines {
        let _ = writeln!(md, "{line}");
    }
}

/// Forward+backward time at T=`last` over T=`first`, per operator.
fn render_scaling(md: &mut String, report: &Report, first: usize, last: usize) {
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
}

fn render_decode(md: &mut String, report: &Report) {
    if report.decode.is_empty() {
        return;
    }
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

pub(super) fn mib(bytes: Option<usize>) -> String {
    bytes.map_or("n/a".into(), |b| format!("{:.1}", b as f64 / 1048576.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of B1 H4 d64 in chunks of 64 whose sections are `train` and `matmul`.
    fn report(train: &str, matmul: &str) -> Report {
        let json = format!(
            r#"{{"device": "wgpu", "quick": false, "chunk": 64, "segment": 0, "batch": 1,
            "heads": 4, "d": 64, "dv": 64, "train": {train}, "operators": [], "decode": [],
            "matmul": {matmul}, "efficiency": [], "chunk_sweep": [], "segment_sweep": []}}"#
        );
        serde_json::from_str(&json).expect("a report")
    }

    /// The header names the operator problem only where a section timed on it ran: the
    /// cost model and the train section state their own shapes.
    #[test]
    fn the_header_names_the_problem_of_the_timed_sections_only() {
        assert!(render(&report("[]", "[]")).starts_with("# hla bench on wgpu\n"));
        let train = r#"[{"workload": "nanogpt", "mixer": "hla2", "batch": 12, "context": 64,
            "parameters": 1, "fused": true, "steps_per_s": 1.0, "tokens_per_s": 768.0,
            "phases_s": [0.5, 0.4, 0.1],
            "timing": {"median_s": 1.0, "min_s": 1.0, "reps": 3, "peak_bytes": null}}]"#;
        let trained = render(&report(train, "[]"));
        assert!(trained.starts_with("# hla bench on wgpu\n"), "{trained}");
        assert!(trained.contains("| nanogpt | hla2 | 12×64 |"), "{trained}");
        let matmul = r#"[{"name": "square 64×64×64", "gflop": 0.0005, "gflops": 0.5}]"#;
        let timed = render(&report("[]", matmul));
        assert!(
            timed.starts_with("# hla bench on wgpu (B=1, H=4, d=dv=64, chunk 64"),
            "{timed}"
        );
        assert!(!timed.contains("gates"), "{timed}");
        let mut gated = report("[]", matmul);
        gated.gates = "data".into();
        let gated = render(&gated);
        assert!(gated.contains(", data-dependent gates)\n"), "{gated}");
    }
}
