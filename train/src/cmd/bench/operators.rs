//! The operator section: time and memory of every operator against sequence length, and
//! the chunked forms' achieved GFLOP/s.

use std::time::Instant;

use anyhow::{Context, Result};
use hla_model::backend::{Kernels, set_kernels};
use hla_model::bench::{Operator, OperatorInputs};
use hla_model::hla::Form;
use serde::{Deserialize, Serialize};

use super::{
    Bench, Forms, Problem, RECURRENT_BACKWARD_MAX, Route, Timing, in_rounds, repetitions, shape,
};
use crate::alloc;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct OperatorRow {
    pub(super) operator: String,
    pub(super) time: usize,
    pub(super) pass: String,
    pub(super) tokens_per_s: f64,
    pub(super) timing: Timing,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EfficiencyRow {
    pub(super) operator: String,
    pub(super) time: usize,
    pub(super) gflop: f64,
    pub(super) gflops: f64,
}

/// An operator, the index of its length, with backward, and the form that runs it.
type Case = (Operator, usize, bool, Route);

impl Bench {
    /// Every operator, pass and length, each in `forms`: one warm-up each, then rounds
    /// that run every case still short of its repetitions, so that the machine's slow
    /// spells spread over all cases (and both ends of a ratio) instead of landing on a few.
    pub(super) fn operators(
        &self,
        only: &[Operator],
        times: &[usize],
        chunk: usize,
        segment: usize,
        forms: &Forms,
    ) -> Result<Vec<OperatorRow>> {
        let form = Form::passes(chunk, segment);
        let autodiff = self.device.clone().autodiff();
        let inputs: Vec<_> = times
            .iter()
            .map(|&time| {
                let shape = shape(self.problem, time, chunk);
                let x = OperatorInputs::gated(&shape, self.gates, &self.device);
                (x, OperatorInputs::gated(&shape, self.gates, &autodiff))
            })
            .collect();
        let cases = self.operator_cases(only, times, forms);
        // Seconds and peak heap bytes of one call.
        let once = |&(op, i, backward, route): &Case| {
            set_kernels(route.kernels());
            let (x, x_grad) = &inputs[i];
            let base = alloc::reset_peak();
            let start = Instant::now();
            if backward {
                drop(x_grad.forward_backward(op, form));
            } else {
                drop(x.forward(op, form));
            }
            self.device.sync().context("waiting for the device")?;
            anyhow::Ok((start.elapsed().as_secs_f64(), alloc::peak() - base))
        };
        let mut reps = Vec::with_capacity(cases.len());
        for case in &cases {
            let name = self.row_name(case.0, case.3);
            eprintln!("operator {name} T={} warm-up", times[case.1]);
            reps.push(repetitions(once(case)?.0));
        }
        let measured = in_rounds("operators", &reps, |c| once(&cases[c]))?;
        set_kernels(Kernels::default());
        Ok(cases
            .iter()
            .zip(measured)
            .map(|(&(op, i, backward, route), (runs, peak))| {
                let pass = if backward {
                    "forward+backward"
                } else {
                    "forward"
                };
                let timing = Timing::of(runs, self.host_memory.then_some(peak));
                let name = self.row_name(op, route);
                let tokens_per_s = (self.problem.batch * times[i]) as f64 / timing.median_s;
                OperatorRow {
                    operator: name,
                    time: times[i],
                    pass: pass.into(),
                    tokens_per_s,
                    timing,
                }
            })
            .collect())
    }

    /// An operator's row name: its name, with the form's suffix where it has several.
    fn row_name(&self, op: Operator, route: Route) -> String {
        match route == Route::Composed && !op.has_kernels(&self.device) {
            true => op.name().to_string(),
            false => format!("{}{}", op.name(), route.suffix()),
        }
    }

    /// Every operator (or those in `only`), pass and length as (operator, index of the
    /// length, with backward, form), each in `forms` ([`Forms::routes`]).
    fn operator_cases(&self, only: &[Operator], times: &[usize], forms: &Forms) -> Vec<Case> {
        let mut cases = Vec::new();
        for (i, &time) in times.iter().enumerate() {
            let wanted = Operator::ALL
                .into_iter()
                .filter(|op| only.is_empty() || only.contains(op));
            for op in wanted {
                let routes = forms.routes(op.has_kernels(&self.device), op.has_node());
                for route in routes {
                    cases.push((op, i, false, route));
                    if op != Operator::Hla2Recurrent || time <= RECURRENT_BACKWARD_MAX {
                        cases.push((op, i, true, route));
                    }
                }
            }
        }
        cases
    }
}

/// Achieved GFLOP/s of the chunked forms' forward passes.
pub(super) fn efficiency(
    rows: &[OperatorRow],
    chunk: usize,
    problem: Problem,
) -> Vec<EfficiencyRow> {
    rows.iter()
        .filter(|r| r.pass == "forward")
        .filter_map(|r| {
            let op: Operator = r.operator.parse().ok()?;
            let gflop = op.chunked_flops(&shape(problem, r.time, chunk))? / 1e9;
            Some(EfficiencyRow {
                operator: r.operator.clone(),
                time: r.time,
                gflop,
                gflops: gflop / r.timing.median_s,
            })
        })
        .collect()
}
