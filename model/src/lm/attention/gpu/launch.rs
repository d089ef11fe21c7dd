//! The attention kernels' launches ([`super::kernel`]): their sizes, grids and arguments.

use burn::backend::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::kernel::{forward_kernel, key_grads, query_grads};
use super::plan::{Pass, tensor_tiles, tiles};
use super::tile_grads::{key_tiles, query_tiles};
use super::tiles::forward_tiles;
use crate::backend::gpu::mma::{Mma, mma, tile_units};
use crate::backend::gpu::{contiguous, cubes, empty, rows_per_unit, unit_budget, units};

/// A launch of one of the attention's kernels on `like`'s client: its tensors, then the
/// call's sizes (queries, keys, start, scale, d, dv), then the kernel's own compile-time
/// sizes (every kernel takes its arguments in this order).
macro_rules! launch {
    ($kernel:ident, ($like:expr, $count:expr, $dim:expr), [$($tensor:expr),* $(,)?],
     ($n:expr, $start:expr), [$($size:expr),* $(,)?]) => {
        $kernel::launch(
            &$like.client.clone(),
            $count,
            $dim,
            $($tensor.into_tensor_arg(),)*
            $n.queries,
            $n.keys,
            $start,
            $n.scale,
            $n.d,
            $n.dv,
            $($size),*
        )
    };
    // The backward kernels' eight tensors, given as one array.
    ($kernel:ident, $grid:tt, $tensors:ident, $sizes:tt, $own:tt) => {{
        let [t0, t1, t2, t3, t4, t5, t6, t7] = $tensors;
        launch!($kernel, $grid, [t0, t1, t2, t3, t4, t5, t6, t7], $sizes, $own)
    }};
}

/// The sizes of a call: `q [b, h, queries, d]`, `v [b, h, keys, dv]`.
struct RowSizes {
    sequences: usize,
    queries: usize,
    keys: usize,
    d: usize,
    dv: usize,
    scale: f32,
    /// Rows of the query tiles and of the shared tiles ([`tiles`]).
    rows: usize,
    tile: usize,
    /// The rows a unit owns in the forward, query and key kernels ([`rows_per_unit`]).
    per_unit: [usize; 3],
}

impl RowSizes {
    fn of(q: &CubeTensor, v: &CubeTensor) -> Self {
        let ([b, h, queries, d], [.., keys, dv]) = (q.shape().dims::<4>(), v.shape().dims::<4>());
        let shared = q.client.properties().hardware.max_shared_memory_size;
        let (rows, tile) = tiles(shared, units(q) as usize, [d, dv], queries)
            .expect("the attention's tiles fit (checked by `fits`)");
        let budget = unit_budget(q);
        Self {
            sequences: b * h,
            queries,
            keys,
            d,
            dv,
            scale: 1.0 / (d as f32).sqrt(),
            rows,
            tile,
            per_unit: [
                rows_per_unit(rows, d + dv, budget),
                rows_per_unit(rows, 2 * d + dv, budget),
                rows_per_unit(tile, 2 * (d + dv), budget),
            ],
        }
    }

    /// A cube of `rows / per_unit` units per tile of `rows` of the `total` rows of every
    /// sequence.
    fn grid(
        &self,
        like: &CubeTensor,
        total: usize,
        rows: usize,
        per_unit: usize,
    ) -> (CubeCount, CubeDim) {
        let count = cubes(like, self.sequences * total.div_ceil(rows));
        (count, CubeDim::new_1d((rows / per_unit) as u32))
    }
}

/// `[q, k, v]` → `o [b, h, Tq, dv]` and the log-sum-exp of every query's scores.
pub(crate) fn forward(inputs: [CubeTensor; 3], start: usize) -> (CubeTensor, CubeTensor) {
    let [q, k, v] = inputs.map(contiguous);
    let n = RowSizes::of(&q, &v);
    let mut o_dims = q.shape().dims::<4>();
    o_dims[3] = n.dv;
    let (o, lse) = (empty(&q, o_dims), empty(&q, [n.sequences * n.queries]));
    if let Some((mma, rows, tile)) = tensor_plan(Pass::Forward, &q, &n) {
        let count = cubes(&q, n.sequences * n.queries.div_ceil(rows));
        let dim = CubeDim::new_1d(tile_units(&mma, units(&q) as usize) as u32);
        launch!(
            forward_tiles,
            (&q, count, dim),
            [q, k, v, o.clone(), lse.clone()],
            (n, start),
            [rows, tile, mma]
        );
        return (o, lse);
    }
    let (count, dim) = n.grid(&q, n.queries, n.rows, n.per_unit[0]);
    launch!(
        forward_kernel,
        (&q, count, dim),
        [q, k, v, o.clone(), lse.clone()],
        (n, start),
        [n.rows, n.tile, n.per_unit[0]]
    );
    (o, lse)
}

/// The fragments and tiles of a tensor-core pass ([`forward_tiles`], [`query_tiles`] and
/// [`key_tiles`]) where the device runs tile products ([`mma`]) and a tile of whole
/// fragments fits its shared memory.
fn tensor_plan(pass: Pass, q: &CubeTensor, n: &RowSizes) -> Option<(Mma, usize, usize)> {
    let mma = mma(q)?;
    let shared = q.client.properties().hardware.max_shared_memory_size;
    let (rows, tile) = tensor_tiles(pass, shared, [n.d, n.dv], n.queries, &mma)?;
    Some((mma, rows, tile))
}

/// Saved `[q, k, v, o, lse]` and `∂o` → `[∂q, ∂k, ∂v]`.
pub(crate) fn backward(saved: [CubeTensor; 5], grad: CubeTensor, start: usize) -> [CubeTensor; 3] {
    let [q, k, v, o, lse] = saved.map(contiguous);
    let grad = contiguous(grad);
    let n = RowSizes::of(&q, &v);
    let (dq, dk, dv) = (
        empty(&q, q.shape().dims::<4>()),
        empty(&q, k.shape().dims::<4>()),
        empty(&q, v.shape().dims::<4>()),
    );
    let delta = empty(&q, [n.sequences * n.queries]);
    let plan = tensor_plan(Pass::Backward, &q, &n);
    // The query kernel's tensors (into ∂q and each row's δ), then the key kernel's (from δ
    // into ∂k and ∂v), whichever kernels run.
    let queries = [
        q.clone(),
        k.clone(),
        v.clone(),
        o,
        lse.clone(),
        grad.clone(),
        dq.clone(),
        delta.clone(),
    ];
    let keys = [q, k, v, lse, delta, grad, dk.clone(), dv.clone()];
    if let Some((mma, rows, tile)) = plan {
        let dim = CubeDim::new_1d(tile_units(&mma, units(&dq) as usize) as u32);
        let count = cubes(&dq, n.sequences * n.queries.div_ceil(rows));
        launch!(
            query_tiles,
            (&dq, count, dim),
            queries,
            (n, start),
            [rows, tile, mma]
        );
        let count = cubes(&dq, n.sequences * n.keys.div_ceil(tile));
        launch!(
            key_tiles,
            (&dq, count, dim),
            keys,
            (n, start),
            [rows, tile, mma]
        );
        return [dq, dk, dv];
    }
    let (count, dim) = n.grid(&dq, n.queries, n.rows, n.per_unit[1]);
    launch!(
        query_grads,
        (&dq, count, dim),
        queries,
        (n, start),
        [n.rows, n.tile, n.per_unit[1]]
    );
    let (count, dim) = n.grid(&dq, n.keys, n.tile, n.per_unit[2]);
    launch!(
        key_grads,
        (&dq, count, dim),
        keys,
        (n, start),
        [n.tile, n.per_unit[2]]
    );
    [dq, dk, dv]
}
