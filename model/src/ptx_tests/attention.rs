//! The attention's kernels as they launch at width 128: one row a unit, and on the tensor
//! cores (four warps a cube, tiles of 64).

use super::{D, assert_module, ptx};
use crate::backend::gpu::mma::CUDA_TF32;
use crate::lm::attention::gpu::kernel::{forward_kernel, key_grads, query_grads};
use crate::lm::attention::gpu::tile_grads::{key_tiles, query_tiles};
use crate::lm::attention::gpu::tiles::forward_tiles;

/// The tiles of queries and of keys.
const TILE: usize = 64;
const SHARED: [&str; 2] = [".shared", "bar.sync"];
const PRODUCTS: [&str; 4] = [".shared", "bar.sync", "mma.sync", ".tf32"];

#[test]
fn the_attentions_row_kernels_compile_to_ptx() {
    let forward = kernel!(
        forward_kernel::ForwardKernel,
        TILE,
        [q k v o lse],
        (), (), (), (),
        D, D, TILE, TILE, 1,
    );
    assert_module("forward_kernel", &ptx(forward, 90), &SHARED);
    let dq = kernel!(
        query_grads::QueryGrads,
        TILE,
        [q k v o lse grad dq delta],
        (), (), (), (),
        D, D, TILE, TILE, 1,
    );
    assert_module("query_grads", &ptx(dq, 90), &SHARED);
    let dkv = kernel!(
        key_grads::KeyGrads,
        TILE,
        [q k v lse delta grad dk dv_out],
        (), (), (), (),
        D, D, TILE, 1,
    );
    assert_module("key_grads", &ptx(dkv, 90), &SHARED);
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
    assert_module("forward_tiles", &ptx(forward, 90), &PRODUCTS);
    let dq = kernel!(
        query_tiles::QueryTiles,
        128,
        [q k v o lse grad dq delta],
        (), (), (), (),
        D, D, TILE, TILE, CUDA_TF32,
    );
    assert_module("query_tiles", &ptx(dq, 90), &PRODUCTS);
    let dkv = kernel!(
        key_tiles::KeyTiles,
        128,
        [q k v lse delta grad dk dv_out],
        (), (), (), (),
        D, D, TILE, TILE, CUDA_TF32,
    );
    assert_module("key_tiles", &ptx(dkv, 90), &PRODUCTS);
}
