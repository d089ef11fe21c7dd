//! The causal attention's GPU kernels against Burn's attention op.

use hla_model::backend::Kernels;

use crate::common::{Rng, rel_rms};
use crate::{cap_grid, emulate_tensor_cores, gpu, kernels, launched, to_cpu};

/// The GPU kernels of the causal attention against Burn's attention op on the same device:
/// the output and the gradients of q, k and v within 1e-4 (relative RMS), over a whole
/// sequence and for queries from a later position (a cache's keys before them), within
/// one tile of rows and over several with a ragged last one (tiles hold at most 64 rows),
/// down to one query.
#[test]
fn gpu_attention_matches_the_composed_form() {
    let _switch = kernels(Kernels::All);
    let cases = [
        ([17, 17, 0], [8, 6]),
        ([5, 12, 7], [8, 6]),
        ([150, 150, 0], [8, 6]),
        ([70, 200, 130], [8, 6]),
        ([1, 77, 76], [8, 6]),
        ([100, 100, 0], [64, 64]),
    ];
    let worst = cases
        .into_iter()
        .map(|(sizes, widths)| attention_vs_composed([2, 3], sizes, widths, REGISTERS))
        .fold(0.0, f64::max);
    eprintln!("GPU attention vs composed form: largest relative RMS error {worst:.2e}");
}

/// The kernels on the tensor cores (emulated: lavapipe has none) against Burn's attention
/// op, as [`gpu_attention_matches_the_composed_form`]: widths of whole fragments, query
/// tiles of one fragment's rows (16) and of several, a ragged last tile, queries after a
/// cache and one decoding query.
#[test]
fn gpu_attention_on_tensor_cores_matches_the_composed_form() {
    let _switch = kernels(Kernels::All);
    let _emulated = emulate_tensor_cores();
    let cases = [
        ([17, 17, 0], [16, 16]),
        ([5, 12, 7], [16, 16]),
        ([150, 150, 0], [16, 32]),
        ([70, 200, 130], [32, 16]),
        ([1, 77, 76], [16, 16]),
        ([100, 100, 0], [64, 64]),
    ];
    let worst = cases
        .into_iter()
        .map(|(sizes, widths)| attention_vs_composed([2, 3], sizes, widths, TILES))
        .fold(0.0, f64::max);
    eprintln!(
        "GPU attention on tensor cores vs composed form: largest relative RMS error {worst:.2e}"
    );
}

/// More tiles of rows than one axis of the grid holds in cubes (65,535 on wgpu, 4 here):
/// the grid spreads over three axes and every tile of queries, and every tile of keys,
/// still gets its cube.
#[test]
fn gpu_attention_takes_more_rows_than_one_grid_axis() {
    let _switch = kernels(Kernels::All);
    let _cap = cap_grid(4);
    // 3 × 5 sequences of 130 rows in tiles of 64: 45 cubes in a 4 × 4 × 3 grid, 3 spare.
    let err = attention_vs_composed([3, 5], [130, 130, 0], [4, 3], REGISTERS);
    eprintln!("GPU attention on a spread grid vs composed form: relative RMS error {err:.2e}");
}

/// The attention's kernels on the CUDA cores (register tiles).
const REGISTERS: [&str; 3] = ["forward_kernel", "query_grads", "key_grads"];
/// The attention's kernels on the tensor cores.
const TILES: [&str; 3] = ["forward_tiles", "query_tiles", "key_tiles"];

/// The largest relative RMS error of the attention kernels (those named `ran`, each
/// asserted to launch) against Burn's attention op on the wgpu device for `[batch,
/// heads]`, `[queries, keys, start]` and widths `[d, dv]`, over the output and the
/// gradients of q, k and v; fails past 1e-4.
fn attention_vs_composed(
    [b, h]: [usize; 2],
    [queries, keys, start]: [usize; 3],
    [d, dv]: [usize; 2],
    ran: [&str; 3],
) -> f64 {
    use hla_model::lm::attention::{causal_attention, causal_attention_composed};
    let ad = gpu().autodiff();
    let mut rng = Rng::new(3);
    let (q, k, v) = (
        rng.tensor([b, h, queries, d], 1.0, &ad).require_grad(),
        rng.tensor([b, h, keys, d], 1.0, &ad).require_grad(),
        rng.tensor([b, h, keys, dv], 1.0, &ad).require_grad(),
    );
    let cotangent = rng.tensor([b, h, queries, dv], 1.0, &ad);
    let mut runs = Vec::new();
    for kernel in [true, false] {
        let run = || {
            let o = if kernel {
                causal_attention(q.clone(), k.clone(), v.clone(), start)
            } else {
                causal_attention_composed(q.clone(), k.clone(), v.clone(), start)
            };
            let grads = (o.clone() * cotangent.clone()).sum().backward();
            let mut out = vec![to_cpu(o.inner())];
            for x in [&q, &k, &v] {
                out.push(to_cpu(x.grad(&grads).expect("gradient")));
            }
            out
        };
        let (out, names) = launched(run);
        if kernel {
            for name in ran {
                assert!(
                    names.iter().any(|n| n.contains(name)),
                    "the attention's {name} ran: {names:?}"
                );
            }
        }
        runs.push(out);
    }
    let mut worst: f64 = 0.0;
    for (i, (got, want)) in runs[0].iter().zip(&runs[1]).enumerate() {
        let err = rel_rms(got, want);
        assert!(
            err <= 1e-4,
            "[{b}, {h}] Tq={queries} Tk={keys} start {start}, result {i}: kernel vs composed {err:.3e}"
        );
        worst = worst.max(err);
    }
    worst
}
