//! The sweep section: chunk-size and segment-size sweeps of the second-order chunked form.

use anyhow::Result;
use hla_model::bench::{Operator, OperatorInputs};
use hla_model::hla::Form;
use serde::{Deserialize, Serialize};

use super::{Bench, Timing, passes, shape};

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SweepRow {
    pub(super) chunk: usize,
    pub(super) segment: usize,
    pub(super) time: usize,
    pub(super) pass: String,
    pub(super) timing: Timing,
}

impl Bench {
    /// [`Self::sweep_point`] at every `(time, chunk, segment)`.
    pub(super) fn sweep(
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
    pub(super) fn sweep_point(
        &self,
        time: usize,
        chunk: usize,
        segment: usize,
    ) -> Result<[SweepRow; 2]> {
        let shape = shape(self.problem, time, chunk);
        let x = OperatorInputs::gated(&shape, self.gates, &self.device);
        let x_grad = OperatorInputs::gated(&shape, self.gates, &self.device.clone().autodiff());
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
