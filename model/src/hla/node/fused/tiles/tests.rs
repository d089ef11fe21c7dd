use burn::backend::Dispatch;
use burn::prelude::*;
use burn::tensor::Distribution;

use super::super::{Grads, MomentGrads, Sums};
use crate::agreement::relative_rms_error;
use crate::backend::{TensorCores, set_tensor_cores};
use crate::hla::chunks::Chunks;
use crate::hla::chunks::fused::{blocks, gates_layout};
use crate::hla::decay::Decay;

/// A moment product's operands in chunks: `q`, `∂Y`, `A`, `U`, `T`, `∂X` after the
/// chunk, the terms so far of ∂Q and `∂A`, the state the read took, and the log gates'
/// gradient so far.
struct Operands {
    q: Tensor<5>,
    dy: Tensor<5>,
    a: Tensor<5>,
    u: Tensor<5>,
    t: Tensor<5>,
    x: Tensor<5>,
    dq_in: Tensor<5>,
    da_in: Tensor<5>,
    x_start: Tensor<5>,
    log_g_in: Tensor<5>,
}

/// The gradients the kernel writes, as the composed form computes them: `∂U` (unless
/// tied), `∂A`, `∂Q` and, with the gates' gradient, the log gates'.
fn composed(o: &Operands, decay: &Decay<5>, power: u32, sums: Sums) -> Vec<Tensor<5>> {
    let p = f64::from(power);
    let dy_u = o.dy.clone().matmul(o.u.clone().transpose());
    let g = decay.mask(dy_u.clone(), power);
    let ea_dx = decay.until_end(o.a.clone(), p).matmul(o.x.clone());
    let eu = decay.until_end(o.u.clone(), p);
    let du = o.t.clone().transpose().matmul(o.dy.clone()) + ea_dx.clone();
    let mut da = g.clone().transpose().matmul(o.q.clone()) + eu.matmul(o.x.clone().transpose());
    if sums.tied {
        da = da + du.clone();
    }
    if sums.a {
        da = da + o.da_in.clone();
    }
    let read = sums.read.then(|| {
        let x_t = match sums.transposed {
            true => o.x_start.clone(),
            false => o.x_start.clone().transpose(),
        };
        decay.since_start(o.dy.clone(), p).matmul(x_t)
    });
    let mut dq = g.matmul(o.a.clone());
    if let Some(read) = &read {
        dq = dq + read.clone();
    }
    if sums.q {
        dq = dq + o.dq_in.clone();
    }
    let mut grads = vec![du, da, dq];
    if sums.gates {
        // ∂b_τ: p times T ⊙ (∂Y Uᵀ)'s row τ less its column τ, less the row of
        // diag(e^p) A ∂X against U (every token's of which reaches the last token's),
        // plus the read's row against Q.
        let tg = o.t.clone() * dy_u;
        let rows = |x: Tensor<5>, y: &Tensor<5>| (x * y.clone()).sum_dim(4);
        let e_part = rows(ea_dx, &o.u);
        let [bs, h, n, c, _] = e_part.dims();
        let zeros = Tensor::<5>::zeros([bs, h, n, c - 1, 1], &e_part.device());
        let through_last = Tensor::cat(vec![zeros, e_part.clone().sum_dim(3)], 3);
        let mut db = tg.clone().sum_dim(4) - tg.sum_dim(3).swap_dims(3, 4) - e_part + through_last;
        if let Some(read) = read {
            db = db + rows(read, &o.q);
        }
        // Each token's Σ_{τ≥s} ∂b_τ; the read's part through ρ^p (p ρ^p ⟨∂X, X'⟩, the two
        // in the same layout) reaches every token.
        let db = db * p;
        let mut log_g = db.clone().sum_dim(3) - db.clone().cumsum(3) + db;
        if sums.read {
            let x_start = o.x_start.clone().reshape(o.x.dims());
            let dot = (o.x.clone() * x_start).sum_dim(4).sum_dim(3);
            log_g = log_g + decay.whole(dot, p) * p;
        }
        if sums.summed {
            log_g = log_g + o.log_g_in.clone();
        }
        grads.push(log_g);
    }
    grads.into_iter().skip(usize::from(sums.tied)).collect()
}

/// The gradients the kernel writes, as [`composed`] lists them, from the tiles (emulated),
/// in chunks.
fn tiles(o: &Operands, decay: &Decay<5>, power: u32, sums: Sums) -> Vec<Tensor<5>> {
    let (layout, b) = gates_layout(&o.q, decay);
    let grads = Grads {
        layout,
        power,
        sums,
    };
    let [q, dy, a, u, t, x, dq_in, da_in, x_start, log_g_in] = [
        &o.q,
        &o.dy,
        &o.a,
        &o.u,
        &o.t,
        &o.x,
        &o.dq_in,
        &o.da_in,
        &o.x_start,
        &o.log_g_in,
    ]
    .map(|t| blocks(t).into_dispatch());
    set_tensor_cores(TensorCores::Emulated);
    let (du, da, dq, log_g) = <Dispatch as MomentGrads>::moment_grads(
        q,
        dy,
        a,
        u,
        t,
        x,
        b.into_dispatch(),
        dq_in,
        da_in,
        x_start,
        log_g_in,
        grads,
    );
    // Fusion runs the custom op when its queue flushes.
    o.q.device().sync().expect("the device runs the kernel");
    set_tensor_cores(TensorCores::default());
    let [bs, h, n, c, _] = o.dy.dims();
    let grads = [du, da, dq, log_g]
        .into_iter()
        .take(3 + usize::from(sums.gates));
    grads
        .skip(usize::from(sums.tied))
        .map(|x| {
            let x = Tensor::<3>::from_dispatch(x);
            let cols = x.dims()[2];
            x.reshape([bs, h, n, c, cols])
        })
        .collect()
}

/// The tiles (emulated on lavapipe) against the composed form: three row and column
/// tiles a chunk (`Tᵀ` and `Gᵀ` from each tile's diagonal on, `G` up to it), `∂U` two
/// tiles wide, with and without the sums in, tied, the read by rows and by columns,
/// without decay, with gates per token (p = 2) and their gradient (with and without an
/// earlier kernel's), and with a per-head decay (p = 3).
#[test]
fn the_tiles_are_the_composed_gradients() {
    let (device, _bounds) = crate::testing::guarded_wgpu();
    let (bs, h, time, c, d) = (2, 2, 70, 48, 16);
    let chunks = Chunks::new(time, c);
    let normal = Distribution::Normal(0.0, 1.0);
    let uniform = Distribution::Uniform(-0.3, 0.0);
    let random =
        |width: usize| chunks.split(Tensor::<4>::random([bs, h, time, width], normal, &device));
    let per_token = Tensor::<3>::random([bs, h, time], uniform, &device);
    let per_head = Tensor::<3>::random([1, h, 1], uniform, &device).expand([1, h, time]);
    let sums = |q, a, tied, read, transposed| Sums {
        q,
        a,
        tied,
        read,
        transposed,
        gates: false,
        summed: false,
    };
    let cases = [
        sums(false, false, false, false, false),
        sums(true, true, false, true, false),
        sums(true, false, false, true, true),
        sums(false, true, true, false, false),
        sums(true, true, true, true, true),
    ];
    // The gates per token take their gradient; the per-head decay is fixed.
    let decays = [
        (None, 1, false),
        (Some(per_token), 2, true),
        (Some(per_head), 3, false),
    ];
    for (log_g, power, gates) in decays {
        let decay = chunks.decay(log_g.as_ref());
        let gated = |sums: Sums| Sums {
            gates,
            summed: gates && sums.a,
            ..sums
        };
        for sums in cases.map(gated) {
            let n = if sums.tied { d } else { 2 * d };
            let a = random(d);
            let chunk_count = a.dims()[2];
            let state =
                |rows, cols| Tensor::<5>::random([bs, h, chunk_count, rows, cols], normal, &device);
            let o = Operands {
                q: random(d),
                dy: random(n),
                u: if sums.tied { a.clone() } else { random(n) },
                a,
                // T is zero above its diagonal, as the forward leaves it.
                t: random(c).tril(0),
                x: state(d, n),
                dq_in: random(d),
                da_in: random(d),
                x_start: if sums.transposed {
                    state(n, d)
                } else {
                    state(d, n)
                },
                log_g_in: random(1),
            };
            let got = tiles(&o, &decay, power, sums);
            let want = composed(&o, &decay, power, sums);
            assert_eq!(got.len(), want.len());
            let errors: Vec<_> = got
                .into_iter()
                .zip(want)
                .map(|(got, want)| relative_rms_error(got, want))
                .collect();
            assert!(
                errors.iter().all(|e| *e < 1e-5),
                "power {power}, {sums:?}: {errors:?}"
            );
        }
    }
}
