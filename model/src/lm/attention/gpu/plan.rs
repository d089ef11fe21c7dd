//! The attention kernels' launch plan ([`super::kernel`]): how many rows their tiles
//! hold on a device, and what their shared tiles read from global memory, which the cost
//! model (`crate::bench::cost`) counts.

use crate::backend::gpu::mma::Mma;

/// The most rows of a tile: cubes of 64 units, and 64 keys and values of width 64 fill
/// 32 KiB of shared memory.
const MAX_TILE: usize = 64;

/// The fewest rows of a tile worth a kernel: with fewer the composed form runs.
const MIN_TILE: usize = 4;

/// The rows of the attention's tiles on a device with `shared_bytes` of shared memory per
/// cube, for heads of width `d` and `dv`: the largest power of two up to [`MAX_TILE`]
/// whose biggest shared tile (rows of `q`, `∂O`, `L` and `D` in the key pass) fits; `None`
/// below [`MIN_TILE`] rows.
pub(crate) fn tile_rows(shared_bytes: usize, d: usize, dv: usize) -> Option<usize> {
    let row_bytes = 4 * (d + dv + 2);
    let fit = (shared_bytes / row_bytes).min(MAX_TILE);
    (fit >= MIN_TILE).then(|| 1 << fit.ilog2())
}

/// The launch plan of a call of `queries` queries from position `start` over `keys` keys,
/// per sequence, on a device with `shared_bytes` of shared memory and cubes of up to
/// `units` units: the forward kernel's cubes, and the floats the shared tiles of the
/// forward and the backward kernels read from global memory (every tile row once per
/// cube that loads it). Each unit's own rows are the kernels' inputs and outputs, read
/// or written once.
pub(crate) struct Plan {
    pub(crate) cubes: usize,
    pub(crate) forward_tile_floats: usize,
    pub(crate) backward_tile_floats: usize,
}

impl Plan {
    /// `None` where the tiles do not fit (the composed form runs).
    pub(crate) fn of(
        [queries, keys, start]: [usize; 3],
        [d, dv]: [usize; 2],
        shared_bytes: usize,
        units: usize,
    ) -> Option<Self> {
        let (rows, tile) = tiles(shared_bytes, units, [d, dv], queries)?;
        let query_tiles = queries.div_ceil(rows);
        // The key and value rows a query tile loads: whole tiles up to its last query's keys.
        let kv_rows: usize = (0..query_tiles)
            .map(|t| {
                let seen = keys.min(start + queries.min((t + 1) * rows));
                keys.min(seen.div_ceil(tile) * tile)
            })
            .sum();
        // The query rows a key tile loads: whole tiles from the first query that sees its
        // first key.
        let q_rows: usize = (0..keys.div_ceil(tile))
            .map(|t| queries.saturating_sub((t * tile).saturating_sub(start) / tile * tile))
            .sum();
        Some(Self {
            cubes: query_tiles,
            forward_tile_floats: kv_rows * (d + dv),
            backward_tile_floats: kv_rows * (d + dv) + q_rows * (d + dv + 2),
        })
    }
}

/// The rows of a call's query tiles and of its shared tiles, on a device with
/// `shared_bytes` of shared memory and cubes of up to `units` units: the query tiles no
/// larger than the queries (decoding), so that few units idle.
pub(super) fn tiles(
    shared_bytes: usize,
    units: usize,
    [d, dv]: [usize; 2],
    queries: usize,
) -> Option<(usize, usize)> {
    let tile = tile_rows(shared_bytes, d, dv)?.min(units);
    Some((tile.min(queries.next_power_of_two()), tile))
}

/// The kernel whose tensor-core tiles a plan sizes: the forward ([`super::tiles`]) or
/// the backward ([`super::tile_grads`]), each with its own shared tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    Backward,
}

impl Pass {
    /// The shared floats a cube of the pass's kernels holds.
    fn shared_floats(self, rows: usize, tile: usize, widths: [usize; 2]) -> usize {
        match self {
            Self::Forward => super::tiles::shared_floats(rows, tile, widths),
            Self::Backward => super::tile_grads::shared_floats(rows, tile, widths),
        }
    }

    /// Whether fragments `mma` tile the pass's products with these tiles and widths.
    fn fits(self, mma: &Mma, rows: usize, tile: usize, widths: [usize; 2]) -> bool {
        match self {
            Self::Forward => super::tiles::fits(mma, rows, tile, widths),
            Self::Backward => super::tile_grads::fits(mma, rows, tile, widths),
        }
    }
}

/// The rows of a tensor-core pass's query tiles and key tiles with fragments `mma`, on a
/// device with `shared_bytes` of shared memory per cube: the largest power of two up to
/// [`MAX_TILE`] whose tiles fit, the query tiles no larger than the queries need (one
/// fragment at least); `None` where no tile of whole fragments fits.
pub(crate) fn tensor_tiles(
    pass: Pass,
    shared_bytes: usize,
    widths: [usize; 2],
    queries: usize,
    mma: &Mma,
) -> Option<(usize, usize)> {
    let bytes = |rows, tile| 4 * pass.shared_floats(rows, tile, widths);
    let mut tile = MAX_TILE;
    while tile > mma.m && bytes(tile, tile) > shared_bytes {
        tile /= 2;
    }
    let rows = tile.min(queries.next_power_of_two().max(mma.m));
    (pass.fits(mma, rows, tile, widths) && bytes(rows, tile) <= shared_bytes)
        .then_some((rows, tile))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiles take the largest power of two up to 64 rows that fits the shared memory, and
    /// none below 4.
    #[test]
    fn tiles_fit_the_shared_memory() {
        assert_eq!(tile_rows(32 * 1024, 64, 64), Some(32));
        assert_eq!(tile_rows(48 * 1024, 128, 128), Some(32));
        assert_eq!(tile_rows(227 * 1024, 128, 128), Some(64));
        assert_eq!(tile_rows(32 * 1024, 8, 6), Some(64));
        assert_eq!(tile_rows(1024, 64, 64), None);
    }

    /// The tensor-core passes take tiles of whole fragments that fit: 64 rows at width
    /// 128 in an H100's 227 KiB, 16 at width 64 in lavapipe's 32 KiB, query tiles of one
    /// fragment's rows for a decoding query; none where a width is no whole fragment or
    /// one fragment's tiles do not fit.
    #[test]
    fn tensor_tiles_are_whole_fragments_that_fit() {
        use crate::backend::gpu::mma::CUDA_TF32 as mma;
        let h100 = 227 * 1024;
        for pass in [Pass::Forward, Pass::Backward] {
            let tiles = |shared, widths, queries| tensor_tiles(pass, shared, widths, queries, &mma);
            assert_eq!(tiles(h100, [128, 128], 2048), Some((64, 64)), "{pass:?}");
            assert_eq!(tiles(32 * 1024, [64, 64], 100), Some((16, 16)), "{pass:?}");
            assert_eq!(tiles(h100, [128, 128], 1), Some((16, 64)), "{pass:?}");
            assert_eq!(tiles(h100, [8, 6], 100), None, "{pass:?}");
            assert_eq!(tiles(1024, [64, 64], 100), None, "{pass:?}");
        }
        // The backward's products are d wide: d = 8 takes no fragments of 16 columns.
        let narrow = |pass| tensor_tiles(pass, h100, [8, 16], 100, &mma);
        assert_eq!(narrow(Pass::Forward), Some((64, 64)));
        assert_eq!(narrow(Pass::Backward), None);
        // The backward's bigger tiles: at width 160 it fits 32 rows where the forward
        // fits 64.
        let wide = |pass| tensor_tiles(pass, h100, [160, 160], 2048, &mma);
        assert_eq!(wide(Pass::Forward), Some((64, 64)));
        assert_eq!(wide(Pass::Backward), Some((32, 32)));
    }

    /// A whole causal sequence of `n` tiles: query tile `t` loads the `t + 1` key tiles up
    /// to it, key tile `t` the `n − t` query tiles from it; queries after a cache load
    /// every key tile up to theirs, and one decoding query a tile of one row.
    #[test]
    fn the_plan_counts_the_tiles_the_kernels_load() {
        let (n, tile, d, dv) = (5, 64, 8, 6);
        let plan = Plan::of([n * tile, n * tile, 0], [d, dv], 1 << 20, 256).unwrap();
        let triangle = tile * n * (n + 1) / 2;
        assert_eq!(plan.cubes, n);
        assert_eq!(plan.forward_tile_floats, triangle * (d + dv));
        assert_eq!(
            plan.backward_tile_floats,
            triangle * (d + dv) + triangle * (d + dv + 2)
        );
        // 10 queries after 130 cached keys: one query tile of 16 rows sees all 140 keys
        // (three key tiles, the last ragged), and every key tile is seen by all 10.
        let cached = Plan::of([10, 140, 130], [d, dv], 1 << 20, 256).unwrap();
        assert_eq!(cached.cubes, 1);
        assert_eq!(cached.forward_tile_floats, 140 * (d + dv));
        assert_eq!(
            cached.backward_tile_floats,
            140 * (d + dv) + 3 * 10 * (d + dv + 2)
        );
        let decoding = Plan::of([1, 77, 76], [d, dv], 1 << 20, 256).unwrap();
        assert_eq!(
            (decoding.cubes, decoding.forward_tile_floats),
            (1, 77 * (d + dv))
        );
    }
}
