//! Input validation and the sign-preserving clamp.

mod common;

use burn::prelude::*;
use common::devices;
use hla_model::hla::{HlaError, HlaInput, fixed_log_gates, sign_preserving_clamp};

#[test]
fn clamp_keeps_the_sign_and_the_magnitude_floor() {
    for device in devices() {
        let x = Tensor::<1>::from_floats([-2.0, -1e-9, 0.0, 1e-9, 3.0], &device);
        let got = common::host(&sign_preserving_clamp(x, 1e-3));
        let want = [-2.0, -1e-3, 1e-3, 1e-3, 3.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-9, "got {got:?}, want {want:?}");
        }
    }
}

#[test]
fn shape_mistakes_are_errors() {
    let device = &devices()[0];
    let t = |dims: [usize; 4]| Tensor::<4>::zeros(dims, device);
    let ok = HlaInput::new(t([2, 4, 8, 5]), t([2, 1, 8, 5]), t([2, 4, 8, 3]), None);
    assert!(ok.is_ok(), "shared keys are valid");
    let bad_k = HlaInput::new(t([2, 4, 8, 5]), t([2, 2, 8, 5]), t([2, 4, 8, 3]), None).unwrap_err();
    assert_eq!(
        bad_k.to_string(),
        "k has shape [2, 2, 8, 5], expected [2, 4 or 1, 8, 5]"
    );
    let bad_v = HlaInput::new(t([2, 4, 8, 5]), t([2, 4, 8, 5]), t([2, 4, 7, 3]), None).unwrap_err();
    assert!(matches!(bad_v, HlaError::Shape { name: "v", .. }));
    let gates = Tensor::<3>::zeros([2, 4, 9], device);
    let bad_g = HlaInput::new(
        t([2, 4, 8, 5]),
        t([2, 4, 8, 5]),
        t([2, 4, 8, 3]),
        Some(gates),
    )
    .unwrap_err();
    assert!(matches!(bad_g, HlaError::Shape { name: "log_g", .. }));
    assert_eq!(
        fixed_log_gates(&[0.9, 1.5], 4, device).unwrap_err(),
        HlaError::Decay(1.5)
    );
}

/// State sizes per sequence (docs/math.md §10, §11): S is stored once per layer only when keys
/// and gates are both shared; the denominator adds one value column.
#[test]
fn state_sizes_follow_the_spec() {
    use hla_model::hla::{HlaState, Order, Output};
    let device = &devices()[0];
    let (h, d, dv) = (4, 8, 6);
    let t = |heads: usize, last: usize| Tensor::<4>::zeros([1, heads, 3, last], device);
    let gates = |heads: usize| Some(Tensor::<3>::zeros([1, heads, 3], device));
    let size = |order, k_heads, g: Option<Tensor<3>>, output| {
        let input = HlaInput::new(t(h, d), t(k_heads, d), t(h, dv), g).unwrap();
        HlaState::zeros(order, &input, output).num_floats()
    };
    let raw = Output::Raw;
    assert_eq!(size(Order::Second, h, None, raw), h * (d * d + d * dv));
    assert_eq!(size(Order::Second, 1, None, raw), d * d + h * d * dv);
    assert_eq!(size(Order::Second, 1, gates(1), raw), d * d + h * d * dv);
    assert_eq!(size(Order::Second, 1, gates(h), raw), h * (d * d + d * dv));
    let normalized = Output::Normalized { eps: 1e-6 };
    assert_eq!(
        size(Order::Second, h, None, normalized),
        h * (d * d + d * (dv + 1))
    );
    assert_eq!(size(Order::First, 1, None, raw), h * d * dv);
    assert_eq!(size(Order::Third, h, None, raw), h * (d * d + 2 * d * dv));
    assert_eq!(size(Order::Asymmetric, h, None, raw), h * 2 * d * dv);
    assert_eq!(
        size(Order::Asymmetric, h, None, normalized),
        h * 2 * d * (dv + 1)
    );
}
