//! The decode section: `Lm::step` latency against position.

use std::time::Instant;

use anyhow::{Context, Result};
use burn::prelude::*;
use hla_model::bench::{advance, decode_model};
use hla_model::lm::MixerKind;
use serde::{Deserialize, Serialize};

use super::{Bench, DECODE_ROUNDS, PREFILL_PIECE, Timing};

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct DecodeRow {
    pub(super) mixer: String,
    pub(super) position: usize,
    pub(super) state_bytes: usize,
    pub(super) timing: Timing,
}

impl Bench {
    /// `Lm::step` latency at every position: one state per position (prefilled), then
    /// [`DECODE_ROUNDS`] rounds of one token at each position after a warm-up round.
    pub(super) fn decode(&self, positions: &[usize]) -> Result<Vec<DecodeRow>> {
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
                    state_bytes: lm.state_sizes(position).iter().sum::<usize>() * size_of::<f32>(),
                    timing: Timing::of(runs, None),
                });
            }
        }
        Ok(rows)
    }
}
