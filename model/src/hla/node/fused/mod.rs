//! The node's backward step as a CubeCL kernel in shared memory, run by its backward pass
//! on a GPU device in place of the composed matmuls, masks and scales: the moment product ([`super::Backward::moment_product`]), per chunk, with
//! the gradient `∂Y` of `Y = T U` (`T = (Q Aᵀ) ⊙ D^p`) and the gradient `∂X` after the
//! chunk of the state `X ← ρ^p X + Aᵀ diag(e^p) U`,
//!
//! ```text
//! G = (∂Y Uᵀ) ⊙ D^p,   ∂U = Tᵀ ∂Y + diag(e^p) A ∂X,   ∂A = Gᵀ Q + diag(e^p) U ∂Xᵀ,   G A
//! ```
//!
//! (first order: `A = K`, `U = V`, `X = S`; hla2: `A`, `V`, `Z`, `p = 2`, then `∂A`'s
//! product with `A = U = K`, `T = W`, `X = S`; third order: `A`, `B`, `Y`, `p = 3`, then
//! `W K` and `W V`; AHLA: `A^γ B` and `A^γ V`), and the term `diag(a^p) ∂Y X'ᵀ` of ∂Q
//! from the state `X'` that the same `∂Y` read (whose gradient's pass back over the
//! chunks, `crate::hla::chunks::fused::pass`, ran before). One cube per chunk of every
//! sequence and head, one unit per token: the cube copies `∂X`, then `Q` and `∂Y`, then
//! `A` and `U`, then `X'` into shared memory once; each unit computes its token's rows of
//! `∂U`, `∂A` (from the columns of `T` and `G`) and `∂Q` (from a row of `G`, then of
//! `X'`) there, its rows of `A`, `U` and `∂Y` and its accumulators in registers, and
//! writes each once. Where the gates need a gradient, each unit also gathers its tokens'
//! parts of it from the factors it used: `e^p` (`diag(e^p) A ∂X` against `U`), `D^p`
//! (`T ⊙ (∂Y Uᵀ)`, its row less its column), the read's `a^p` (its term of ∂Q against
//! `Q`) and `ρ^p` (`∂X` against `X'`), and the cube writes the log gates' gradient itself,
//! the earlier kernel's added. The products run on the CUDA cores; where a device has
//! tensor cores, the step runs as their tiles instead ([`tiles`]).

pub(crate) mod kernel;
pub(crate) mod tiles;

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use burn_cubecl::cubecl::prelude::CubeDim;

use crate::backend::gpu::mma::{Mma, planned_within, tile_units, tiles_within};
use crate::backend::gpu::{contiguous, cubes, empty, units};
use crate::hla::chunks::fused::{Layout, blocks, chunked, grid, layout, sizes};
use crate::hla::decay::Decay;
pub(crate) use kernel::Sums;
use kernel::grads_kernel;

/// What one call computes: the chunks' layout, the decay's power `p` and which sums it
/// makes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grads {
    pub(crate) layout: Layout,
    pub(crate) power: u32,
    pub(crate) sums: Sums,
}

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `q`, `a` `[blocks, c, d]`, `dy`, `u` `[blocks, c, n]`, `t` `[blocks, c,
/// c]`, `x` (`∂X` after every chunk) `[blocks, d, n]`, `dq_in`, `da_in` (read only where
/// `grads.sums` adds to them; any tensor stands in elsewhere) `[blocks, c, d]`, `x_start`
/// (the state `∂Y` read, at every chunk's start, where `grads.sums.read`; the gates stand
/// in elsewhere) `[blocks, d, n]` or `[blocks, n, d]`, with blocks = batch × heads ×
/// chunks; the cumulative log gates `b [gb · gh, chunks · c]`; where `grads.sums.summed`,
/// the log gates' gradient so far `log_g_in [blocks, c, 1]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait MomentGrads: Backend {
    /// `(∂U [blocks, c, n] ([1] when tied), ∂A [blocks, c, d], G A [blocks, c, d], the
    /// log gates' gradient [blocks, c, 1] ([1] without `sums.gates`))`, with the sums of
    /// [`Sums`].
    #[fusion(meta = grads_specs)]
    #[allow(clippy::too_many_arguments)]
    fn moment_grads(
        q: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        a: FloatTensor<Self>,
        u: FloatTensor<Self>,
        t: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dq_in: FloatTensor<Self>,
        da_in: FloatTensor<Self>,
        x_start: FloatTensor<Self>,
        log_g_in: FloatTensor<Self>,
        grads: Grads,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

#[allow(clippy::too_many_arguments)]
fn grads_specs(
    q: &TensorSpec,
    dy: &TensorSpec,
    _a: &TensorSpec,
    _u: &TensorSpec,
    _t: &TensorSpec,
    _x: &TensorSpec,
    _b: &TensorSpec,
    _dq_in: &TensorSpec,
    _da_in: &TensorSpec,
    _x_start: &TensorSpec,
    _log_g_in: &TensorSpec,
    grads: &Grads,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    let spec = |shape: &Shape| TensorSpec::new(shape.clone(), q.dtype);
    let [du, log_g] = out_shapes(&q.shape, &dy.shape, grads.sums);
    (spec(&du), spec(&q.shape), spec(&q.shape), spec(&log_g))
}

/// The shapes of `∂U` (`∂Y`'s, or one float, unwritten, when `∂A` takes it) and the log
/// gates' gradient (`[blocks, c, 1]`, or one float, unwritten, without it), from `q`'s and
/// `∂Y`'s.
fn out_shapes(q: &Shape, dy: &Shape, sums: Sums) -> [Shape; 2] {
    let one = || Shape::new([1]);
    let du = if sums.tied { one() } else { dy.clone() };
    let log_g = if sums.gates {
        Shape::new([q[0], q[1], 1])
    } else {
        one()
    };
    [du, log_g]
}

/// Launches `$kernel`, the register kernel's or the tile kernel's launch (the same
/// arguments but their last, `$last`), on `$count` cubes of `$dim`: `$inputs` as
/// [`MomentGrads::moment_grads`] takes them, into `$outputs` `[∂U, ∂A, ∂Q, ∂log g]`.
macro_rules! launch_grads {
    ($kernel:expr, ($count:expr, $dim:expr), $inputs:expr, $outputs:expr, $grads:expr, $last:expr) => {{
        let [q, dy, a, u, t, x, b, dq_in, da_in, x_start, log_g_in] = $inputs;
        let [du, da, dq, log_g] = $outputs;
        let grads: Grads = $grads;
        let ([_, c, d], n) = (q.shape().dims::<3>(), u.shape().dims::<3>()[2]);
        $kernel(
            &q.client.clone(),
            $count,
            $dim,
            q.into_tensor_arg(),
            dy.into_tensor_arg(),
            a.into_tensor_arg(),
            u.into_tensor_arg(),
            t.into_tensor_arg(),
            x.into_tensor_arg(),
            b.into_tensor_arg(),
            dq_in.into_tensor_arg(),
            da_in.into_tensor_arg(),
            x_start.into_tensor_arg(),
            log_g_in.into_tensor_arg(),
            du.clone().into_tensor_arg(),
            da.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            log_g.clone().into_tensor_arg(),
            grads.layout.gate_arg(),
            grads.power as f32,
            c,
            d,
            n,
            grads.layout.decayed,
            grads.sums,
            $last,
        )
    }};
}

impl MomentGrads for CubeBackend {
    fn moment_grads(
        q: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        a: FloatTensor<Self>,
        u: FloatTensor<Self>,
        t: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dq_in: FloatTensor<Self>,
        da_in: FloatTensor<Self>,
        x_start: FloatTensor<Self>,
        log_g_in: FloatTensor<Self>,
        grads: Grads,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let inputs = [q, dy, a, u, t, x, b, dq_in, da_in, x_start, log_g_in].map(contiguous);
        let (q, u) = (&inputs[0], &inputs[3]);
        let ([blocks, c, d], n) = (q.shape().dims::<3>(), u.shape().dims::<3>()[2]);
        let [du, log_g] =
            out_shapes(&q.shape(), &inputs[1].shape(), grads.sums).map(|s| empty(q, s));
        let (da, dq) = (empty(q, [blocks, c, d]), empty(q, [blocks, c, d]));
        let outputs = [&du, &da, &dq, &log_g];
        let fit = |mma: &Mma| tiles::grads_tiles_fit(mma, c, d, n);
        let shared = tiles::grads_tiles_shared(c, d, n, grads.sums.gates);
        if let Some(mma) = tiles_within(q, fit, shared) {
            let dim = CubeDim::new_1d(tile_units(&mma, units(q) as usize) as u32);
            let count = cubes(q, blocks);
            let kernel = tiles::grads_tiles_kernel::launch;
            launch_grads!(kernel, (count, dim), inputs, outputs, grads, mma);
            return (du, da, dq, log_g);
        }
        // A unit's rows: a, u, dy and the sums of ∂U, ∂A and ∂Q.
        let (count, dim, per_unit) = grid(q, blocks, c, 3 * (d + n));
        launch_grads!(
            grads_kernel::launch,
            (count, dim),
            inputs,
            outputs,
            grads,
            per_unit
        );
        (du, da, dq, log_g)
    }
}

/// What a moment product's gradients add to: ∂Q's terms so far, a term of `∂A`, whether
/// `A = U` (`∂A` then takes `∂U`), and the state `∂Y` read (at every chunk's start, and
/// whether it is read transposed), whose terms of ∂Q and of the gates' gradient the kernel
/// adds; whether the gates need a gradient, and the log gates' gradient so far (an earlier
/// kernel's, `[b, h, chunks, c, 1]`).
#[derive(Clone, Copy)]
pub(crate) struct Adds<'a> {
    pub(crate) dq: Option<&'a Tensor<5>>,
    pub(crate) da: Option<&'a Tensor<5>>,
    pub(crate) tied: bool,
    pub(crate) read: Option<(&'a Tensor<5>, bool)>,
    pub(crate) gates: bool,
    pub(crate) log_g: Option<&'a Tensor<5>>,
}

/// What [`moment_grads`] gives, in chunks: `∂U [b, h, chunks, c, n]` (`None` when tied),
/// `∂A` and `∂Q` `[.., c, d]`, and with the gates' gradient the log gates' gradient so
/// far `[.., c, 1]`: each token's `Σ_{τ≥s} ∂b_τ` over the product's (and the read's) decay
/// factors, with [`Adds::log_g`] added.
pub(crate) struct ProductGrads {
    pub(crate) du: Option<Tensor<5>>,
    pub(crate) da: Tensor<5>,
    pub(crate) dq: Tensor<5>,
    pub(crate) log_g: Option<Tensor<5>>,
}

/// The gradients of a moment product ([`ProductGrads`]) from `q`, `∂Y`, `(A, U, T)` and
/// `∂X` after every chunk with the decay's power `power`, where the kernel takes them:
/// `∂Q` is `G A` plus `adds.dq`, `∂A` plus `adds.da`, and with `adds.tied` `∂A` has `∂U`
/// added.
pub(crate) fn moment_grads(
    q: &Tensor<5>,
    dy: &Tensor<5>,
    [a, u, t]: [&Tensor<5>; 3],
    x_after: &Tensor<5>,
    (decay, power): (&Decay<5>, u32),
    adds: Adds<'_>,
) -> Option<ProductGrads> {
    use burn::backend::Dispatch;
    let mut operands = vec![q, u, dy, a, t, x_after];
    operands.extend(adds.dq.into_iter().chain(adds.da));
    operands.extend(adds.read.map(|(x, _)| x));
    let (layout, b) = layout(&operands, decay)?;
    let sums = Sums {
        q: adds.dq.is_some(),
        a: adds.da.is_some(),
        tied: adds.tied,
        read: adds.read.is_some(),
        transposed: adds.read.is_some_and(|(_, transposed)| transposed),
        gates: adds.gates,
        summed: adds.log_g.is_some(),
    };
    // Where nothing is added, q stands in (unread); without a read or the gates' gradient
    // so far, the gates (2-D, so the cost model tells them apart).
    let or_q = |x: Option<&Tensor<5>>| blocks(x.unwrap_or(q)).into_dispatch();
    let or_b =
        |x: Option<Tensor<3>>| x.map_or_else(|| b.clone().into_dispatch(), Tensor::into_dispatch);
    let x_start = or_b(adds.read.map(|(x, _)| blocks(x)));
    let log_g_in = or_b(adds.log_g.map(blocks));
    let (du, da, dq, log_g) = <Dispatch as MomentGrads>::moment_grads(
        blocks(q).into_dispatch(),
        blocks(dy).into_dispatch(),
        blocks(a).into_dispatch(),
        blocks(u).into_dispatch(),
        blocks(t).into_dispatch(),
        blocks(x_after).into_dispatch(),
        b.into_dispatch(),
        or_q(adds.dq),
        or_q(adds.da),
        x_start,
        log_g_in,
        Grads {
            layout,
            power,
            sums,
        },
    );
    Some(ProductGrads {
        du: (!adds.tied).then(|| chunked(du, u)),
        da: chunked(da, q),
        dq: chunked(dq, q),
        log_g: adds.gates.then(|| chunked(log_g, q)),
    })
}

/// Whether fusion's custom op `id` is the kernel on tensor-core tiles on an H100 or H200
/// ([`tiles`], with `shared` bytes a cube), from its inputs' and outputs' shapes (the log
/// gates' gradient, the fourth output, `[blocks, c, 1]` where the gates take one): what
/// the cost model plans for those GPUs, the tensor cores not turned off.
pub(crate) fn planned_tiles(
    id: &str,
    inputs: &[Vec<usize>],
    outputs: &[Vec<usize>],
    shared: usize,
) -> bool {
    if !id.contains("moment_grads") {
        return false;
    }
    let ([_, c, d], n) = (sizes(&inputs[0]).map(|x| x as usize), inputs[1][2]);
    let gates = outputs.get(3).is_some_and(|log_g| log_g.len() == 3);
    let fit = |mma: &Mma| tiles::grads_tiles_fit(mma, c, d, n);
    planned_within(fit, tiles::grads_tiles_shared(c, d, n, gates), shared)
}

/// FLOPs of the kernel if fusion's custom op `id` is its, from its inputs' shapes (`q
/// [blocks, c, d]`, `∂Y [blocks, c, n]`, ..., `x_start` 3-D where it takes a read's term):
/// the multiply-adds of its products, those of the moment product through `T` and `G`
/// over `σ ≥ τ` (columns) or `σ ≤ τ` (rows) only (the gates' gradient, four a token pair
/// beside their `3n + 2d`, is not counted).
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("moment_grads") {
        return None;
    }
    let [blocks, c, d] = sizes(&inputs[0]);
    let n = sizes(&inputs[1])[2];
    let read = if inputs[9].len() == 3 { 2.0 } else { 0.0 };
    Some(blocks * ((4.0 + read) * c * d * n + c * (c + 1.0) * (3.0 * n + 2.0 * d)))
}
