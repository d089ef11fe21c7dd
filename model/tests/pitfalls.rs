//! The paper's formulas that docs/math.md shows to be wrong (§5, §6, §7, §8, §12) must be
//! caught by the same comparison the forms pass; their corrected twins must pass it.

mod common;

use burn::prelude::*;
use common::{Case, Gates, TOL, devices, input, rel_rms};
use hla_model::hla::{Form, Order, Output, forward};

/// Sequences are `[1, 1, T, n]`; `row(x, t)` is token t as a `[1, 1, 1, n]` row.
fn row(x: &Tensor<4>, t: usize) -> Tensor<4> {
    x.clone().slice(s![.., .., t..=t, ..])
}

fn col(x: &Tensor<4>, t: usize) -> Tensor<4> {
    row(x, t).swap_dims(2, 3)
}

fn tr(x: Tensor<4>) -> Tensor<4> {
    x.swap_dims(2, 3)
}

fn zeros(rows: usize, cols: usize, device: &Device) -> Tensor<4> {
    Tensor::zeros([1, 1, rows, cols], device)
}

fn single_sequence(
    order: Order,
    time: usize,
    gates: Gates,
    device: &Device,
) -> (
    Tensor<4>,
    Tensor<4>,
    Tensor<4>,
    Option<Tensor<3>>,
    Tensor<4>,
) {
    let case = Case {
        batch: 1,
        heads: 1,
        time,
        gates,
        ..Case::new(order)
    };
    let (qkv, log_g, _) = case.tensors(device);
    let (reference, _) = forward(
        order,
        Form::Reference,
        input(&qkv, &log_g),
        None,
        Output::Raw,
    );
    (
        qkv[0].clone(),
        qkv[1].clone(),
        qkv[2].clone(),
        log_g,
        reference,
    )
}

fn assert_caught(name: &str, wrong: &Tensor<4>, reference: &Tensor<4>) {
    let err = rel_rms(wrong, reference);
    eprintln!("{name}: relative RMS error {err:.2e} (caught)");
    assert!(
        err > 100.0 * TOL,
        "{name} was not caught: relative RMS error {err:.3e}"
    );
}

fn assert_exact(name: &str, right: &Tensor<4>, reference: &Tensor<4>) {
    let err = rel_rms(right, reference);
    assert!(err <= TOL, "{name}: relative RMS error {err:.3e}");
}

/// Spec §5 [E]: Figure 1(C) of the paper omits `q_tᵀ S_prev Σ_{j≤t} q_j v_jᵀ`.
#[test]
fn chunk_formula_without_cross_term_is_caught() {
    for device in devices() {
        let (q, k, v, _, reference) = single_sequence(Order::Second, 40, Gates::None, &device);
        let (d, dv, c) = (q.dims()[3], v.dims()[3], 8);
        let chunked = |with_cross_term: bool| {
            let (mut s, mut z) = (zeros(d, d, &device), zeros(d, dv, &device));
            let mut outs = Vec::new();
            for from in (0..40).step_by(c) {
                let span = |x: &Tensor<4>| x.clone().slice(s![.., .., from..from + c, ..]);
                let (qc, kc, vc) = (span(&q), span(&k), span(&v));
                let w = qc.clone().matmul(tr(kc.clone())).tril(0);
                let mut t = w.clone().matmul(tr(w.clone()));
                if with_cross_term {
                    t = t + qc.clone().matmul(s.clone()).matmul(tr(qc.clone()));
                }
                outs.push(qc.clone().matmul(z.clone()) + t.tril(0).matmul(vc.clone()));
                let a = qc.matmul(s.clone()) + w.matmul(kc.clone());
                z = z + tr(a).matmul(vc);
                s = s + tr(kc.clone()).matmul(kc);
            }
            Tensor::cat(outs, 2)
        };
        assert_caught("paper Fig. 1(C) chunk formula", &chunked(false), &reference);
        assert_exact("docs/math.md §5 chunk formula", &chunked(true), &reference);
    }
}

/// Spec §6 [E]: the paper's decayed `G_t = γ G_{t−1} + k_t(k_tᵀ C_{t−1})`; the corrected
/// rule is `G_t = g² G_{t−1} + g k_t(k_tᵀ C_{t−1})`.
#[test]
fn paper_decayed_g_rule_is_caught() {
    for device in devices() {
        let (q, k, v, log_g, reference) =
            single_sequence(Order::Second, 30, Gates::Data { lo: 0.6 }, &device);
        let g: Vec<f64> = common::host(&log_g.unwrap())
            .into_iter()
            .map(f64::exp)
            .collect();
        let (d, dv) = (q.dims()[3], v.dims()[3]);
        let serial = |corrected: bool| {
            let (mut s, mut c, mut gm) = (
                zeros(d, d, &device),
                zeros(d, dv, &device),
                zeros(d, dv, &device),
            );
            let mut outs = Vec::new();
            for (t, &gt) in g.iter().enumerate() {
                let cross = col(&k, t).matmul(row(&k, t).matmul(c.clone()));
                gm = if corrected {
                    gm * (gt * gt) + cross * gt
                } else {
                    gm * gt + cross
                };
                s = s * gt + col(&k, t).matmul(row(&k, t));
                c = c * gt + col(&q, t).matmul(row(&v, t));
                outs.push(row(&q, t).matmul(s.clone().matmul(c.clone()) - gm.clone()));
            }
            Tensor::cat(outs, 2)
        };
        assert_caught("paper decayed G rule", &serial(false), &reference);
        assert_exact("corrected decayed G rule", &serial(true), &reference);
    }
}

/// A Z-form that decays Z once (`Z ← g Z + …`) instead of twice is wrong too.
#[test]
fn single_decay_of_z_is_caught() {
    for device in devices() {
        let (q, k, v, log_g, reference) = single_sequence(Order::Second, 30, Gates::Fixed, &device);
        let g: Vec<f64> = common::host(&log_g.unwrap())
            .into_iter()
            .map(f64::exp)
            .collect();
        let (d, dv) = (q.dims()[3], v.dims()[3]);
        let (mut s, mut z) = (zeros(d, d, &device), zeros(d, dv, &device));
        let mut outs = Vec::new();
        for (t, &gt) in g.iter().enumerate() {
            s = s * gt + col(&k, t).matmul(row(&k, t));
            z = z * gt + s.clone().matmul(col(&q, t)).matmul(row(&v, t));
            outs.push(row(&q, t).matmul(z.clone()));
        }
        assert_caught(
            "Z decayed by g instead of g²",
            &Tensor::cat(outs, 2),
            &reference,
        );
    }
}

/// Spec §8 [E]: the paper's masked third-order kernel (Algorithm 3) is not
/// `((W Wᵀ) ⊙ L) W V`.
#[test]
fn paper_third_order_kernel_is_caught() {
    for device in devices() {
        let (q, k, v, _, reference) = single_sequence(Order::Third, 20, Gates::None, &device);
        let (d, dv) = (q.dims()[3], v.dims()[3]);
        let (mut sk, mut sq, mut p) = (
            zeros(d, d, &device),
            zeros(d, d, &device),
            zeros(d, dv, &device),
        );
        let (mut g1, mut g2, mut g3) = (
            zeros(d, dv, &device),
            zeros(d, dv, &device),
            zeros(d, dv, &device),
        );
        let mut outs = Vec::new();
        for t in 0..20 {
            let (qc, kc) = (col(&q, t), col(&k, t));
            g1 = g1
                + kc.clone()
                    .matmul(tr(sq.clone().matmul(kc.clone())).matmul(p.clone()));
            g2 = g2
                + sk.clone()
                    .matmul(qc.clone())
                    .matmul(row(&q, t).matmul(p.clone()));
            g3 = g3
                + sk.clone()
                    .matmul(sq.clone())
                    .matmul(kc.clone())
                    .matmul(row(&v, t));
            sk = sk + kc.clone().matmul(row(&k, t));
            sq = sq + qc.matmul(row(&q, t));
            p = p + kc.matmul(row(&v, t));
            let f = sk.clone().matmul(sq.clone()).matmul(p.clone())
                - g1.clone()
                - g2.clone()
                - g3.clone();
            outs.push(row(&q, t).matmul(f));
        }
        assert_caught("paper Algorithm 3", &Tensor::cat(outs, 2), &reference);
    }
}

/// Spec §7 [E]: Figure 2(C) of the paper uses `R_{<t}`; it must be `R_{≤t}`.
#[test]
fn ahla_chunk_off_by_one_is_caught() {
    for device in devices() {
        let (q, k, v, _, reference) = single_sequence(Order::Asymmetric, 40, Gates::None, &device);
        let (d, dv, c) = (q.dims()[3], v.dims()[3], 5);
        let chunked = |diagonal: i64| {
            let (mut p, mut e) = (zeros(d, dv, &device), zeros(d, dv, &device));
            let mut outs = Vec::new();
            for from in (0..40).step_by(c) {
                let span = |x: &Tensor<4>| x.clone().slice(s![.., .., from..from + c, ..]);
                let (qc, kc, vc) = (span(&q), span(&k), span(&v));
                let qk = qc.clone().matmul(tr(kc.clone()));
                let a = qk.clone().tril(0);
                let qp = qc.clone().matmul(p.clone());
                let intra = a.clone().matmul(a.clone()).tril(0).matmul(vc.clone());
                outs.push(qc.matmul(e.clone()) + qk.tril(diagonal).matmul(qp.clone()) + intra);
                e = e + tr(kc.clone()).matmul(qp) + tr(kc.clone()).matmul(a.matmul(vc.clone()));
                p = p + tr(kc).matmul(vc);
            }
            Tensor::cat(outs, 2)
        };
        assert_caught("paper Fig. 2(C) with R_<t", &chunked(-1), &reference);
        assert_exact("AHLA chunk with R_<=t", &chunked(0), &reference);
    }
}

/// Spec §12: the design note's `G += q vᵀ` (a copy of C) and division by t.
#[test]
fn design_note_pseudo_code_is_caught() {
    for device in devices() {
        let (q, k, v, _, reference) = single_sequence(Order::Second, 30, Gates::None, &device);
        let (d, dv) = (q.dims()[3], v.dims()[3]);
        let (mut s, mut c, mut g) = (
            zeros(d, d, &device),
            zeros(d, dv, &device),
            zeros(d, dv, &device),
        );
        let (mut outs, mut scaled) = (Vec::new(), Vec::new());
        for t in 0..30 {
            s = s + col(&k, t).matmul(row(&k, t));
            c = c + col(&q, t).matmul(row(&v, t));
            let out = row(&q, t).matmul(s.clone().matmul(c.clone()) - g.clone());
            g = g + col(&q, t).matmul(row(&v, t));
            outs.push(out / (t + 1) as f64);
            scaled.push(row(&reference, t) / (t + 1) as f64);
        }
        assert_caught(
            "design-note pseudo-code",
            &Tensor::cat(outs, 2),
            &Tensor::cat(scaled, 2),
        );
    }
}
