//! The matmul section: plain matmuls, the reference for the chunked forms' GFLOP/s.

use anyhow::Result;
use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::Bench;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct MatmulRow {
    pub(super) name: String,
    pub(super) gflop: f64,
    pub(super) gflops: f64,
}

impl Bench {
    /// A square `n³` matmul and the batched chunk-shaped `Q Kᵀ` of the longest sequence,
    /// the two references for the chunked form's GFLOP/s.
    pub(super) fn matmuls(&self, n: usize, time: usize, chunk: usize) -> Result<Vec<MatmulRow>> {
        let (d, chunks) = (self.problem.d, self.problem.heads * time.div_ceil(chunk));
        let cases = [
            (format!("square {n}×{n}×{n}"), [1, 1, n, n, n]),
            (
                format!("chunk-shaped {chunks}×({chunk}×{d}×{chunk})"),
                [self.problem.batch, chunks, chunk, d, chunk],
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
}
