//! The tables of results.md (every run; the best of each `best_of` group; the means of
//! each `mean_over` group) and results.csv.

use std::fmt::Write as _;

use super::{Mean, Row, Stat, best_of_groups, means};
use crate::run::experiment::{Experiment, Metric};

/// A column of the tables: its header and how a row fills it (`None`: blank).
struct Column {
    header: &'static str,
    cell: fn(&Row) -> Option<String>,
}

/// The columns that describe a run: model, data, size, speed.
fn describe(rows: &[Row]) -> Vec<Column> {
    let any = |f: fn(&Row) -> bool| rows.iter().any(f);
    let mut columns = vec![
        Column {
            header: "mixer",
            cell: |r| Some(r.mixer.clone()),
        },
        Column {
            header: "d_model",
            cell: |r| Some(r.d_model.to_string()),
        },
        Column {
            header: "T",
            cell: |r| Some(r.seq_len.to_string()),
        },
    ];
    if any(Row::is_mqar) {
        columns.push(Column {
            header: "N",
            cell: |r| r.kv_pairs.map(|n| n.to_string()),
        });
    }
    columns.extend([
        Column {
            header: "lr",
            cell: |r| Some(format!("{:e}", r.lr)),
        },
        Column {
            header: "params",
            cell: |r| Some(r.params.to_string()),
        },
        Column {
            header: "state floats",
            cell: |r| Some(r.state_floats.to_string()),
        },
        Column {
            header: "steps",
            cell: |r| Some(r.steps.to_string()),
        },
        Column {
            header: "wall (s)",
            cell: |r| Some(format!("{:.1}", r.wall_seconds)),
        },
        Column {
            header: "tokens/s",
            cell: |r| Some(format!("{:.0}", r.tokens_per_second)),
        },
    ]);
    columns
}

/// Every column of a single run: its description and its outcomes.
fn columns(rows: &[Row]) -> Vec<Column> {
    let any = |f: fn(&Row) -> bool| rows.iter().any(f);
    let mut columns = describe(rows);
    columns.extend([
        Column {
            header: "final loss",
            cell: |r| Some(format!("{:.4}", r.final_loss)),
        },
        Column {
            header: "best loss",
            cell: |r| r.best_loss.map(|v| format!("{v:.4}")),
        },
    ]);
    if any(|r| r.estimate_loss.is_some()) {
        columns.push(Column {
            header: "estimate loss",
            cell: |r| r.estimate_loss.map(|v| format!("{v:.4}")),
        });
    }
    if any(|r| r.recall.is_some()) {
        columns.extend([
            Column {
                header: "recall loss",
                cell: |r| r.recall.map(|x| format!("{:.4}", x.hits.loss)),
            },
            Column {
                header: "other loss",
                cell: |r| r.recall.map(|x| format!("{:.4}", x.other.loss)),
            },
            Column {
                header: "recall share",
                cell: |r| {
                    r.recall.map(|x| {
                        let all = (x.hits.tokens + x.other.tokens).max(1);
                        format!("{:.3}", x.hits.tokens as f64 / all as f64)
                    })
                },
            },
        ]);
    }
    if any(Row::is_mqar) {
        columns.extend([
            Column {
                header: "final acc",
                cell: |r| r.final_accuracy.map(|v| format!("{v:.4}")),
            },
            Column {
                header: "best acc",
                cell: |r| r.best_accuracy.map(|v| format!("{v:.4}")),
            },
        ]);
    }
    columns
}

/// A line of a table: cells before the columns, the row that fills them, cells after.
struct Line<'a> {
    lead: Vec<String>,
    row: &'a Row,
    trail: Vec<String>,
}

impl<'a> Line<'a> {
    fn new(lead: Vec<String>, row: &'a Row) -> Self {
        Self {
            lead,
            row,
            trail: Vec::new(),
        }
    }
}

/// Headers: `lead`, the columns', `trail`.
fn markdown_table(
    out: &mut String,
    [lead, trail]: [&[&str]; 2],
    columns: &[Column],
    lines: &[Line],
) {
    let headers: Vec<&str> = lead
        .iter()
        .copied()
        .chain(columns.iter().map(|c| c.header))
        .chain(trail.iter().copied())
        .collect();
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(headers.len()));
    for line in lines {
        let cells: Vec<String> = line
            .lead
            .iter()
            .cloned()
            .chain(
                columns
                    .iter()
                    .map(|c| (c.cell)(line.row).unwrap_or_default()),
            )
            .chain(line.trail.iter().cloned())
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
}

/// The table of means: one line per mean group, outcomes as mean ± standard deviation.
fn means_table(out: &mut String, over: &[String], rows: &[Row]) {
    let means = means(rows);
    let estimate = means.iter().any(|m| m.estimate_loss.is_some());
    let accuracy = means.iter().any(|m| m.final_accuracy.is_some());
    let _ = writeln!(
        out,
        "## Mean over {} (± sample standard deviation over the runs)\n",
        over.join(", ")
    );
    let mut trail = vec!["final loss"];
    trail.extend(estimate.then_some("estimate loss"));
    trail.extend(accuracy.then_some("final acc"));
    let mean_rows: Vec<Row> = means.iter().map(|m| m.row.clone()).collect();
    let lines: Vec<Line> = means
        .iter()
        .map(|m: &Mean| {
            let show = |s: &Option<Stat>| s.map(|s| s.show()).unwrap_or_default();
            let mut cells = vec![m.final_loss.show()];
            cells.extend(estimate.then(|| show(&m.estimate_loss)));
            cells.extend(accuracy.then(|| show(&m.final_accuracy)));
            Line {
                lead: vec![m.row.name.clone(), m.runs.to_string()],
                row: &m.row,
                trail: cells,
            }
        })
        .collect();
    markdown_table(
        out,
        [&["group", "runs"], &trail],
        &describe(&mean_rows),
        &lines,
    );
    out.push('\n');
}

/// results.md: the best run of each group (with `best_of`), then every run.
pub fn markdown(experiment: &Experiment, rows: &[Row], metric: Metric) -> String {
    let mut out = format!("# {}\n\n", experiment.title);
    let _ = writeln!(
        out,
        "{} of {} runs finished. Loss: mean cross-entropy per scored token (nats); \
         final: the full pass over the validation split at the end of training; best: the \
         best validation during training{}; state floats: the recurrent state (softmax: KV \
         cache) of all layers for one sequence of T tokens. Every run: results.csv.\n",
        rows.len(),
        experiment.runs.len(),
        if rows.iter().any(|r| r.estimate_loss.is_some()) {
            " (nanoGPT's random-batch estimate); estimate: that estimate at the end"
        } else {
            ""
        },
    );
    let summaries = &experiment.results;
    if !summaries.mean_over.is_empty() {
        means_table(&mut out, &summaries.mean_over, rows);
    }
    let best_of = &summaries.best_of;
    if !best_of.is_empty() {
        let _ = writeln!(
            out,
            "## Best over {} (by {})\n",
            best_of.join(", "),
            metric.name()
        );
        let groups = best_of_groups(rows, metric);
        let best: Vec<Line> = groups
            .iter()
            .map(|(row, count)| {
                let lead = vec![row.group.clone(), format!("{} (of {count})", row.name)];
                Line::new(lead, row)
            })
            .collect();
        markdown_table(
            &mut out,
            [&["group", "best run"], &[]],
            &columns(rows),
            &best,
        );
        out.push('\n');
    }
    if !(best_of.is_empty() && summaries.mean_over.is_empty()) {
        out.push_str("## All runs\n\n");
    }
    let all: Vec<Line> = rows
        .iter()
        .map(|r| Line::new(vec![r.name.clone()], r))
        .collect();
    markdown_table(&mut out, [&["run"], &[]], &columns(rows), &all);
    out
}

/// results.csv: every finished run, every column.
pub fn csv(rows: &[Row]) -> String {
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::from(
        "name,group,mixer,d_model,n_layers,short_conv,lr,seq_len,kv_pairs,params,state_floats,\
         steps,wall_seconds,tokens_per_second,final_loss,final_accuracy,best_loss,\
         best_accuracy,estimate_loss,recall_loss,recall_tokens,other_loss,other_tokens\n",
    );
    for r in rows {
        let recall = |f: fn(&super::Recall) -> String| r.recall.as_ref().map(f).unwrap_or_default();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.name,
            r.group,
            r.mixer,
            r.d_model,
            r.n_layers,
            r.short_conv,
            r.lr,
            r.seq_len,
            r.kv_pairs.map(|n| n.to_string()).unwrap_or_default(),
            r.params,
            r.state_floats,
            r.steps,
            r.wall_seconds,
            r.tokens_per_second,
            r.final_loss,
            opt(r.final_accuracy),
            opt(r.best_loss),
            opt(r.best_accuracy),
            opt(r.estimate_loss),
            recall(|x| x.hits.loss.to_string()),
            recall(|x| x.hits.tokens.to_string()),
            recall(|x| x.other.loss.to_string()),
            recall(|x| x.other.tokens.to_string()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::run::experiment::Results;

    fn row(name: &str, mean_group: &str, loss: f64) -> Row {
        Row {
            name: name.into(),
            group: name.into(),
            mean_group: mean_group.into(),
            mixer: mean_group.into(),
            d_model: 128,
            n_layers: 4,
            short_conv: 4,
            lr: 1e-3,
            seq_len: 64,
            kv_pairs: None,
            params: 800_000,
            state_floats: 1000,
            steps: 2000,
            wall_seconds: 100.0,
            tokens_per_second: 10_000.0,
            final_loss: loss,
            final_accuracy: None,
            best_loss: Some(loss),
            best_accuracy: None,
            estimate_loss: Some(loss + 0.01),
            recall: None,
            curve: vec![(1000, loss + 0.5), (2000, loss)],
        }
    }

    #[test]
    fn means_table_has_a_line_per_group_with_the_spread() {
        let experiment = Experiment {
            dir: PathBuf::new(),
            title: "t".into(),
            results: Results {
                mean_over: vec!["seed".into()],
                ..Results::default()
            },
            runs: Vec::new(),
        };
        let rows = [
            row("hla2-seed1", "hla2", 1.0),
            row("hla2-seed2", "hla2", 2.0),
            row("linear-seed1", "linear", 3.0),
        ];
        let md = markdown(&experiment, &rows, Metric::Loss);
        assert!(md.contains("## Mean over seed"), "{md}");
        assert!(
            md.contains("| group | runs | mixer | d_model |")
                && md.contains("| tokens/s | final loss | estimate loss |"),
            "{md}"
        );
        assert!(
            md.contains("| hla2 | 2 | hla2 | 128 |")
                && md.contains("| 1.5000 ± 0.7071 | 1.5100 ± 0.7071 |"),
            "{md}"
        );
        assert!(md.contains("| linear | 1 | linear |") && md.contains("| 3.0000 | 3.0100 |"));
        assert!(md.contains("## All runs") && md.contains("| linear-seed1 | linear |"));
        let means = means(&rows);
        assert_eq!(means[0].row.curve, [(1000, 2.0), (2000, 1.5)]);
    }
}
