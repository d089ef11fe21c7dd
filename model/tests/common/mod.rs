//! Shared helpers for the HLA tests: devices, seeded data, the comparison metric.
#![allow(dead_code)] // each test binary uses its own subset

use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use hla_model::agreement::relative_rms_error;
use hla_model::hla::{HlaInput, HlaState, Order, Output};
use hla_model::lm::{Lm, LmConfig, MixerKind};

/// The tolerance of every f32 comparison: relative RMS error (flash-linear-attention's metric).
pub const TOL: f64 = 1e-4;

/// Every mixer of the language model.
pub const MIXERS: [MixerKind; 5] = [
    MixerKind::Hla2,
    MixerKind::Hla3,
    MixerKind::Ahla,
    MixerKind::Linear,
    MixerKind::Softmax,
];

/// The tiny language model the model tests train and compare: width 32, 2 layers, 2 heads,
/// chunks of 8, 64 positions.
pub fn tiny(mixer: MixerKind) -> LmConfig {
    LmConfig::new(37)
        .with_mixer(mixer)
        .with_d_model(32)
        .with_n_layers(2)
        .with_n_heads(2)
        .with_chunk_size(8)
        .with_max_seq_len(64)
}

/// Every CPU device compiled into this build (the default build has both, ndarray and flex).
pub fn devices() -> Vec<Device> {
    let out: Vec<Device> = vec![
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        Device::ndarray(),
        #[cfg(feature = "flex")]
        Device::flex(),
    ];
    assert!(
        !out.is_empty(),
        "build the tests with a CPU backend feature (ndarray or flex)"
    );
    out
}

/// `rms(a − b) / rms(b)` (see [`relative_rms_error`]).
pub fn rel_rms<const D: usize>(a: &Tensor<D>, b: &Tensor<D>) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    relative_rms_error(a.clone(), b.clone())
}

pub fn host<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
        .into_iter()
        .map(f64::from)
        .collect()
}

/// Seeded normal numbers (splitmix64 + Box–Muller): the same data on every device.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    pub fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    pub fn tensor<const D: usize>(
        &mut self,
        dims: [usize; D],
        scale: f64,
        device: &Device,
    ) -> Tensor<D> {
        let n = dims.iter().product();
        let values: Vec<f32> = (0..n).map(|_| (self.normal() * scale) as f32).collect();
        Tensor::from_data(TensorData::new(values, dims), device)
    }
}

/// The decay option of a case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gates {
    None,
    /// A fixed γ_h per head (RetNet's multi-scale 1 − 2^(−5−h)).
    Fixed,
    /// Per-token gates in [lo, 1), one per (batch, gate head, token).
    Data {
        lo: f64,
    },
}

/// One configuration of the operator and its input.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub order: Order,
    pub batch: usize,
    pub heads: usize,
    pub time: usize,
    pub d: usize,
    pub dv: usize,
    pub shared_keys: bool,
    /// With shared keys: gates shared across heads too (one S per layer).
    pub shared_gates: bool,
    pub gates: Gates,
    pub output: Output,
    pub init_state: bool,
    pub seed: u64,
}

impl Case {
    pub fn new(order: Order) -> Self {
        Self {
            order,
            batch: 2,
            heads: 3,
            time: 17,
            d: 5,
            dv: 4,
            shared_keys: false,
            shared_gates: false,
            gates: Gates::None,
            output: Output::Raw,
            init_state: false,
            seed: 7,
        }
    }

    fn normalized(&self) -> bool {
        matches!(self.output, Output::Normalized { .. })
    }

    /// The case's tensors on `device`: `[q, k, v, log_g?]` and the initial state tensors.
    /// Normalised cases use nonnegative q, k and state, as the denominator is meant to
    /// (docs/math.md §9), so that no denominator is near zero.
    pub fn tensors(
        &self,
        device: &Device,
    ) -> (Vec<Tensor<4>>, Option<Tensor<3>>, Option<Vec<Tensor<4>>>) {
        let mut rng = Rng::new(self.seed);
        let (b, h, t, d, dv) = (self.batch, self.heads, self.time, self.d, self.dv);
        let hk = if self.shared_keys { 1 } else { h };
        let sign = |x: Tensor<4>| if self.normalized() { x.abs() } else { x };
        let scale = 1.0 / (d as f64).sqrt();
        let q = sign(rng.tensor([b, h, t, d], scale, device));
        let k = sign(rng.tensor([b, hk, t, d], scale, device));
        let v = rng.tensor([b, h, t, dv], 1.0, device);
        let gate_heads = if self.shared_keys && self.shared_gates {
            1
        } else {
            h
        };
        let log_g = match self.gates {
            Gates::None => None,
            Gates::Fixed => {
                let gammas =
                    hla_model::hla::multi_scale_decay(h, hla_model::hla::DEFAULT_DECAY_BASE);
                Some(hla_model::hla::fixed_log_gates(&gammas, t, device).unwrap())
            }
            Gates::Data { lo } => {
                let n = b * gate_heads * t;
                let values: Vec<f32> = (0..n).map(|_| rng.between(lo, 1.0).ln() as f32).collect();
                Some(Tensor::from_data(
                    TensorData::new(values, [b, gate_heads, t]),
                    device,
                ))
            }
        };
        let init = self.init_state.then(|| {
            let input = HlaInput::new(q.clone(), k.clone(), v.clone(), log_g.clone()).unwrap();
            HlaState::zeros(self.order, &input, self.output)
                .tensors()
                .into_iter()
                .map(|z| sign(rng.tensor(z.dims(), 0.3, device)))
                .collect()
        });
        (vec![q, k, v], log_g, init)
    }
}

/// Builds the operator input from a case's tensors.
pub fn input(qkv: &[Tensor<4>], log_g: &Option<Tensor<3>>) -> HlaInput {
    HlaInput::new(
        qkv[0].clone(),
        qkv[1].clone(),
        qkv[2].clone(),
        log_g.clone(),
    )
    .unwrap()
}

/// Largest error seen per comparison, printed at the end of a test (`--nocapture`).
#[derive(Default)]
pub struct Worst {
    errors: std::collections::BTreeMap<String, f64>,
    checks: usize,
}

impl Worst {
    /// Records `rel_rms(got, want)` under `name` and fails above [`TOL`] with `context`.
    pub fn check<const D: usize>(
        &mut self,
        name: &str,
        got: &Tensor<D>,
        want: &Tensor<D>,
        context: &dyn std::fmt::Debug,
    ) {
        let err = rel_rms(got, want);
        assert!(
            err <= TOL,
            "{name}: relative RMS error {err:.3e} > {TOL:e} for {context:?}"
        );
        let entry = self.errors.entry(name.to_string()).or_insert(0.0);
        *entry = entry.max(err);
        self.checks += 1;
    }

    pub fn report(&self, title: &str) {
        eprintln!(
            "{title}: {} checks; largest relative RMS error per comparison",
            self.checks
        );
        for (name, err) in &self.errors {
            eprintln!("  {name:<40} {err:.2e}");
        }
    }
}

/// Every parameter's gradient in `grads`, flattened, in visiting order (off the autodiff
/// graph).
pub fn param_grads(lm: &Lm, grads: &burn::tensor::Gradients) -> Vec<Tensor<1>> {
    struct Grads<'a> {
        grads: &'a burn::tensor::Gradients,
        out: Vec<Tensor<1>>,
    }
    impl ModuleVisitor for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let grad = param
                .grad(self.grads)
                .expect("every parameter gets a gradient");
            self.out.push(grad.flatten(0, D - 1));
        }
    }
    let mut visitor = Grads {
        grads,
        out: Vec::new(),
    };
    lm.visit(&mut visitor);
    visitor.out.into_iter().map(|g| g.inner()).collect()
}
