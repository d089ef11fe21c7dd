//! `hla generate`: prefill a prompt with the chunked form, then stream tokens from the
//! recurrent state.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use burn::prelude::*;
use hla_data::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::run::devices;
use crate::run::run_dir::RunDir;
use crate::run::usage::usage;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    #[arg(long)]
    run: PathBuf,
    #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    max_tokens: usize,
    /// Softmax temperature; 0 picks the most likely token.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true, value_parser = temperature)]
    temperature: f64,
    /// Sample among the k most likely tokens only.
    #[arg(long, value_parser = at_least_one)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compute device: flex, ndarray or wgpu (if compiled in).
    #[arg(long, default_value = devices::default_name())]
    device: String,
}

/// A temperature (clap's parser: a bad one exits with status 2, naming the flag); `-1` is
/// read as a value, so that it gets this message rather than "unexpected argument".
fn temperature(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err("expected a number ≥ 0 (0 picks the most likely token)".into()),
    }
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number ≥ 1".into()),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let device = devices::parse(&args.device)?;
    let run = RunDir::new(&args.run);
    let config = run.load_config(&[])?;
    if !run.tokenizer().exists() {
        return Err(usage(format!(
            "{} has no tokenizer (an MQAR run?): generate needs a text run",
            args.run.display()
        )));
    }
    let tokenizer = Tokenizer::load(&run.tokenizer())?;
    let lm = run.load_model(&config, tokenizer.vocab_size(), &device)?;
    let prompt = tokenizer
        .encode(&args.prompt)
        .map_err(|e| usage(format!("the prompt cannot be encoded: {e}")))?;
    if prompt.is_empty() {
        return Err(usage("the prompt encodes to no tokens"));
    }
    let lm_config = config.lm_config(tokenizer.vocab_size());
    if let Some(limit) = lm_config.position_limit()
        && prompt.len() + args.max_tokens > limit
    {
        return Err(usage(format!(
            "the prompt ({} tokens) and --max-tokens {} run past the {limit} positions of this \
             model (model.max_seq_len of softmax attention's RoPE table or learned positions)",
            prompt.len(),
            args.max_tokens
        )));
    }
    let ids: Vec<i64> = prompt.iter().map(|&t| t.into()).collect();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, prompt.len()]), &device);
    let mut state = lm.init_state(1);
    let mut next = lm.prefill_last(input, &mut state);

    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut out = std::io::stdout().lock();
    write!(out, "{}", args.prompt)?;
    let (mut generated, mut printed) = (Vec::new(), 0);
    for _ in 0..args.max_tokens {
        let logits: Vec<f32> = next
            .into_data()
            .convert::<f32>()
            .try_to_vec()
            .expect("f32 data");
        let token = sample(&logits, args.temperature, args.top_k, &mut rng);
        generated.push(token);
        // Print what decodes completely so far (a byte or BPE token may end mid-character).
        let text = tokenizer.decode(&generated)?;
        let complete = text.trim_end_matches('\u{FFFD}');
        if complete.len() > printed {
            write!(out, "{}", &complete[printed..])?;
            out.flush()?;
            printed = complete.len();
        }
        let token =
            Tensor::<1, Int>::from_data(TensorData::new(vec![i64::from(token)], [1]), &device);
        next = lm.step(token, &mut state);
    }
    writeln!(out)?;
    Ok(())
}

/// Samples a token from `logits` with `temperature` (0: argmax) among the `top_k` best.
fn sample(logits: &[f32], temperature: f64, top_k: Option<usize>, rng: &mut ChaCha8Rng) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if temperature == 0.0 {
        return order[0] as u32;
    }
    order.truncate(top_k.unwrap_or(order.len()).min(order.len()));
    let best = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - best) / temperature).exp())
        .collect();
    let mut u = rng.random_range(0.0..weights.iter().sum::<f64>());
    for (&i, w) in order.iter().zip(&weights) {
        u -= w;
        if u <= 0.0 {
            return i as u32;
        }
    }
    *order.last().expect("a non-empty vocabulary") as u32
}
