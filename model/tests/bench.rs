//! The benchmark workloads compute what they claim: every operator runs forward and
//! backward on ragged lengths, the chunked and recurrent HLA agree, and FLOP counts follow
//! the per-chunk formulas.

mod common;

use common::{TOL, devices, rel_rms};
use hla_model::bench::{Operator, OperatorInputs, Shape5};
use hla_model::hla::Form;

fn shape(time: usize, chunk: usize) -> Shape5 {
    Shape5 {
        batch: 1,
        heads: 2,
        time,
        d: 8,
        dv: 4,
        chunk,
    }
}

#[test]
fn workloads_run_forward_and_backward() {
    for device in devices() {
        let shape = shape(37, 16);
        let x = OperatorInputs::random(&shape, &device.clone().autodiff());
        // Passes of 32 tokens: a whole one and a ragged one.
        let form = Form::Segmented {
            chunk: shape.chunk,
            segment: 32,
        };
        for op in Operator::ALL {
            assert_eq!(x.forward(op, form).dims(), [1, 2, 37, 4], "{op:?}");
            let grad = x.forward_backward(op, form);
            assert_eq!(grad.dims(), [1, 2, 37, 8], "{op:?}");
            assert!(
                grad.abs().sum().into_scalar::<f32>() > 0.0,
                "{op:?}: zero gradient"
            );
        }
        let chunked = x.forward(Operator::Hla2Chunked, form);
        let recurrent = x.forward(Operator::Hla2Recurrent, form);
        assert!(rel_rms(&chunked, &recurrent) < TOL);
    }
}

#[test]
fn flops_follow_the_chunk_formulas() {
    let one = Shape5 {
        batch: 1,
        heads: 1,
        time: 2,
        d: 1,
        dv: 1,
        chunk: 2,
    };
    // Per chunk of C = 2, d = dv = 1: 2·C²·(3d + dv) + 4·C·d·(d + dv) = 32 + 16.
    assert_eq!(Operator::Hla2Chunked.chunked_flops(&one), Some(48.0));
    // 2·C²·(d + dv) + 4·C·d·dv = 16 + 8.
    assert_eq!(Operator::LinearChunked.chunked_flops(&one), Some(24.0));
    // 2·C²·(3d + 2dv) + 4·C·d·(d + 2dv) = 40 + 24.
    assert_eq!(Operator::Hla3Chunked.chunked_flops(&one), Some(64.0));
    // 2·C²·(d + 2dv) + 8·C·d·dv = 24 + 16.
    assert_eq!(Operator::AhlaChunked.chunked_flops(&one), Some(40.0));
    // A ragged last chunk is padded, and counts whole; batch and heads multiply.
    let ragged = Shape5 {
        batch: 2,
        heads: 3,
        time: 3,
        ..one
    };
    assert_eq!(
        Operator::Hla2Chunked.chunked_flops(&ragged),
        Some(48.0 * 2.0 * 6.0)
    );
    assert_eq!(Operator::Softmax.chunked_flops(&one), None);
    assert_eq!(Operator::Hla2Recurrent.chunked_flops(&one), None);
}
