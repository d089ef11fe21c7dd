//! Criterion benchmarks of the operators (forward, forward+backward) against sequence
//! length, and of decoding one token. `hla bench` reports the same workloads with ratios
//! and memory; these give criterion's statistics and regression tracking.
//! Run with `cargo bench -p hla-model`.

use std::time::Duration;

use burn::prelude::*;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hla_model::bench::{Operator, OperatorInputs, Shape5, advance, decode_model};
use hla_model::hla::Form;
use hla_model::lm::MixerKind;

const CHUNK: usize = 64;
/// The language model's default chunk-parallel form.
const FORM: Form = Form::Chunked(CHUNK);
/// Room past the nominal position for the tokens decoded while measuring.
const DRIFT: usize = 20_000;

#[allow(deprecated)]
fn device() -> Device {
    Device::ndarray()
}

fn shape(time: usize) -> Shape5 {
    Shape5 {
        batch: 1,
        heads: 4,
        time,
        d: 64,
        dv: 64,
        chunk: CHUNK,
    }
}

fn operators(c: &mut Criterion) {
    let device = device();
    let autodiff = device.clone().autodiff();
    for (pass, backward) in [("forward", false), ("forward+backward", true)] {
        let mut group = c.benchmark_group(pass);
        group.sample_size(10);
        for time in [512, 2048] {
            group.throughput(Throughput::Elements(time as u64));
            let x =
                OperatorInputs::random(&shape(time), if backward { &autodiff } else { &device });
            for op in Operator::ALL {
                group.bench_with_input(BenchmarkId::new(op.name(), time), &x, |b, x| {
                    b.iter(|| {
                        if backward {
                            x.forward_backward(op, FORM)
                        } else {
                            x.forward(op, FORM)
                        }
                    })
                });
            }
        }
        group.finish();
    }
}

fn decode(c: &mut Criterion) {
    let device = device();
    // Every iteration decodes one more token, so a short measurement keeps the position
    // (and softmax attention's KV cache) near its nominal value.
    let mut group = c.benchmark_group("decode");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(2));
    for mixer in [MixerKind::Hla2, MixerKind::Softmax] {
        for position in [64, 4096] {
            let lm = decode_model(mixer, position + DRIFT, &device);
            let mut state = lm.init_state(1);
            advance(&lm, &mut state, position, 1024, &device);
            let token = Tensor::<1, Int>::zeros([1], &device);
            group.bench_function(BenchmarkId::new(mixer.name(), position), |b| {
                b.iter(|| lm.step(token.clone(), &mut state))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, operators, decode);
criterion_main!(benches);
