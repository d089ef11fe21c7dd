//! `hla verify`: the reference, recurrent and chunked forms of every operator agree on
//! this device, for outputs and final states.

use anyhow::{Result, bail};
use burn::prelude::*;
use burn::tensor::Distribution;
use hla_model::agreement::relative_rms_error;
use hla_model::hla::{
    DEFAULT_DECAY_BASE, Form, HlaInput, HlaState, Order, Output, fixed_log_gates, forward,
    multi_scale_decay,
};

use crate::run::devices;

/// Largest relative RMS error allowed in f32.
const TOLERANCE: f64 = 1e-4;
/// Largest relative RMS error allowed where f32 matmuls run on TF32 tensor cores (cuda):
/// about four times TF32's rounding of one operand (2⁻¹¹); the forms measured 3e-4 apart
/// on an H200, and a wrong form is off by far more.
const TF32_TOLERANCE: f64 = 2e-3;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Compute device: flex, ndarray or wgpu (if compiled in).
    #[arg(long, default_value = devices::default_name())]
    device: String,
    /// Sequence length.
    #[arg(long, default_value_t = 257, value_parser = clap::value_parser!(u32).range(1..))]
    time: u32,
    /// Chunk size of the chunked form.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
    /// Heads (each with its own keys and decay).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    heads: u32,
    /// Query/key and value dimension per head.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    dim: u32,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// One operator configuration to check.
struct Variant {
    order: Order,
    decay: bool,
    output: Output,
}

pub fn run(args: &Args) -> Result<()> {
    let device = devices::parse(&args.device)?;
    device.seed(args.seed);
    let (t, h, d) = (args.time as usize, args.heads as usize, args.dim as usize);
    let log_g = fixed_log_gates(&multi_scale_decay(h, DEFAULT_DECAY_BASE), t, &device)?;
    let scale = 1.0 / (d as f64).sqrt();
    let normal =
        |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, scale), &device);
    let (q, k, v) = (
        normal([1, h, t, d]).abs(),
        normal([1, h, t, d]).abs(),
        normal([1, h, t, d]),
    );

    println!(
        "{:<11} {:<6} {:<10} {:>12} {:>12}",
        "operator", "decay", "output", "recurrent", "chunked"
    );
    let mut worst: f64 = 0.0;
    for variant in variants() {
        let gates = variant.decay.then(|| log_g.clone());
        let input = HlaInput::new(q.clone(), k.clone(), v.clone(), gates)?;
        let run = |form| forward(variant.order, form, input.clone(), None, variant.output);
        let reference = run(Form::Reference);
        let errors = [Form::Recurrent, Form::Chunked(args.chunk as usize)]
            .map(|form| error(&run(form), &reference));
        let output = match variant.output {
            Output::Raw => "raw",
            Output::Normalized { .. } => "normalized",
        };
        println!(
            "{:<11} {:<6} {:<10} {:>12.2e} {:>12.2e}",
            format!("{:?}", variant.order),
            if variant.decay { "fixed" } else { "none" },
            output,
            errors[0],
            errors[1]
        );
        worst = errors.into_iter().fold(worst, f64::max);
    }
    let (tolerance, why) = if hla_model::backend::tf32_matmuls(&device) {
        (TF32_TOLERANCE, ", this device's f32 matmuls run in TF32")
    } else {
        (TOLERANCE, "")
    };
    if worst > tolerance {
        bail!("the forms disagree: largest relative RMS error {worst:.2e} > {tolerance:e}{why}");
    }
    println!("all forms agree (largest relative RMS error {worst:.2e} ≤ {tolerance:e}{why})");
    Ok(())
}

fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    for order in [Order::First, Order::Second, Order::Third, Order::Asymmetric] {
        for decay in [false, true] {
            for output in [Output::Raw, Output::Normalized { eps: 1e-6 }] {
                out.push(Variant {
                    order,
                    decay,
                    output,
                });
            }
        }
    }
    out
}

/// The largest relative RMS error over the output and every state tensor.
fn error(got: &(Tensor<4>, HlaState), want: &(Tensor<4>, HlaState)) -> f64 {
    let states = got.1.tensors().into_iter().zip(want.1.tensors());
    std::iter::once((got.0.clone(), want.0.clone()))
        .chain(states)
        .map(|(a, b)| relative_rms_error(a, b))
        .fold(0.0, f64::max)
}
