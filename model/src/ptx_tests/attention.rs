//! The attention's kernels as they launch at width 128: one row a unit, and on the tensor
//! cores (four warps a cube, tiles of 64).

use super::{D, PRODUCTS, SHARED, assert_compiles};
use crate::backend::gpu::mma::CUDA_TF32;
use crate::lm::attention::gpu::kernel::{forward_kernel, key_grads, query_grads};
use crate::lm::attention::gpu::tile_grads::{key_tiles, query_tiles};
use crate::lm::attention::gpu::tiles::forward_tiles;

/// The tiles of queries and of keys.
const TILE: usize = 64;

#[test]
fn the_attentions_row_kernels_compile_to_ptx() {
    let forward = kernel!(
        forward_kernel::ForwardKernel,
        TILE,
        [q k v o lse],
        (), (), (), (),
        D, D, TILE, TILE, 1,
    );
    assert_compiles("forward_kernel", forward, &SHARED);
    let dq = kernel!(
        query_grads::QueryGrads,
        TILE,
        [q k v o lse grad dq delta],
        (), (), (), (),
        D, D, TILE, TILE, 1,
    );
    assert_compiles("query_grads", dq, &SHARED);
    let dkv = kernel!(
        key_grads::KeyGrads,
        TILE,
        [q k v lse delta grad dk dv_out],
        (), (), (), (),
        D, D, TILE, 1,
    );
    assert_compiles("key_grads", dkv, &SHARED);
}

#[test]
fn the_attentions_tensor_core_tiles_compile_to_ptx() {
    let forward = kernel!(
        forward_tiles::ForwardTiles,
        128,
        [q k v o lse],
        (), (), (), (),
        D, D, TILE, TILE, CUDA_TF32,
    );
    assert_compiles("forward_tiles", forward, &PRODUCTS);
    let dq = kernel!(
        query_tiles::QueryTiles,
        128,
        [q k v o lse grad dq delta],
        (), (), (), (),
        D, D, TILE, TILE, CUDA_TF32,
    );
    assert_compiles("query_tiles", dq, &PRODUCTS);
    let dkv = kernel!(
        key_tiles::KeyTiles,
        128,
        [q k v lse delta grad dk dv_out],
        (), (), (), (),
        D, D, TILE, TILE, CUDA_TF32,
    );
    assert_compiles("key_tiles", dkv, &PRODUCTS);
}
