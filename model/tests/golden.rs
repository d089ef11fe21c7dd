//! Independent golden values: outputs computed in float64 outside Rust, by explicit sums
//! over index tuples (the definitions of docs/math.md), in `golden/generate.py`.

mod common;

use burn::prelude::*;
use common::{TOL, devices, rel_rms};
use hla_model::hla::{Form, HlaInput, Order, Output, forward};
use serde_json::Value;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[test]
fn all_forms_match_float64_definitions() {
    let fixture: Value = serde_json::from_str(include_str!("golden/golden.json")).expect("fixture");
    let dim = |name: &str| fixture["shape"][name].as_u64().expect("shape") as usize;
    let (b, h, t, d, dv) = (dim("batch"), dim("heads"), dim("time"), dim("d"), dim("dv"));
    let eps = fixture["normalize_eps"].as_f64().expect("eps");
    let expected = fixture["expected"].as_object().expect("expected");
    assert_eq!(
        expected.len(),
        16,
        "4 operators × gates on/off × normalised on/off"
    );

    for device in devices() {
        let tensor4 = |name: &str, last: usize| {
            Tensor::<4>::from_data(
                TensorData::new(floats(&fixture[name]), [b, h, t, last]),
                &device,
            )
        };
        let (q, k, v) = (tensor4("q", d), tensor4("k", d), tensor4("v", dv));
        let log_g = Tensor::<3>::from_data(
            TensorData::new(floats(&fixture["log_g"]), [b, h, t]),
            &device,
        );
        for (key, values) in expected {
            let order = match key.split('_').next() {
                Some("linear") => Order::First,
                Some("hla2") => Order::Second,
                Some("hla3") => Order::Third,
                Some("ahla") => Order::Asymmetric,
                other => panic!("unknown case {other:?}"),
            };
            let gates = key.contains("_gated").then(|| log_g.clone());
            let output = if key.contains("_normalized") {
                Output::Normalized { eps }
            } else {
                Output::Raw
            };
            let want =
                Tensor::<4>::from_data(TensorData::new(floats(values), [b, h, t, dv]), &device);
            for form in [
                Form::Reference,
                Form::Recurrent,
                Form::Chunked(1),
                Form::Chunked(3),
                Form::Chunked(64),
            ] {
                let input = HlaInput::new(q.clone(), k.clone(), v.clone(), gates.clone()).unwrap();
                let (o, _) = forward(order, form, input, None, output);
                let err = rel_rms(&o, &want);
                eprintln!("golden {key:<24} {form:?}: {err:.2e}");
                assert!(err <= TOL, "{key} {form:?}: relative RMS error {err:.3e}");
            }
        }
    }
}
