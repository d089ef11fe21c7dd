//! Causal softmax attention, `softmax(q kᵀ / √d) v`, of queries at positions
//! `start .. start + Tq` over keys `0 .. Tk`: query `i` sees keys `j ≤ start + i`. On CPU
//! devices one CPU kernel each way ([`cpu`]): tiled with an online softmax, no `Tq × Tk`
//! tensor in the forward or the backward pass (FlashAttention-2's algorithm). On CubeCL
//! devices (wgpu, cuda) kernels with the same algorithm and FlashAttention-2's tiling: a
//! cube per tile of rows, the other side's rows in shared memory ([`gpu`]).
//! Elsewhere Burn's attention op.

pub(crate) mod cpu;
#[cfg(gpu_kernels)]
pub(crate) mod gpu;

use burn::prelude::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

/// `q [batch, heads, Tq, d]`, `k [batch, heads, Tk, d]`, `v [batch, heads, Tk, dv]` →
/// `[batch, heads, Tq, dv]`, with `start + Tq ≤ Tk`.
pub fn causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, start: usize) -> Tensor<4> {
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&q) {
        use cpu::AttentionCpuOps;
        let o = <burn::backend::Dispatch as AttentionCpuOps>::attention(
            q.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            start,
        );
        return Tensor::from_dispatch(o);
    }
    #[cfg(gpu_kernels)]
    if crate::backend::takes_attention_kernel(&q) && gpu::fits(&q, &k, &v) {
        use gpu::AttentionGpuOps;
        let o = <burn::backend::Dispatch as AttentionGpuOps>::attention(
            q.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            start,
        );
        return Tensor::from_dispatch(o);
    }
    causal_attention_composed(q, k, v, start)
}

/// The composed form of [`causal_attention`] (Burn's attention op with a causal mask), the
/// test oracle.
pub fn causal_attention_composed(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    start: usize,
) -> Tensor<4> {
    let [b, h, time, _] = q.dims();
    let total = k.dims()[2];
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: start == 0 && time == total,
    };
    let mask = (!options.is_causal).then(|| {
        // Query i (absolute position start + i) sees keys 0..=start + i.
        Tensor::<2, Bool>::tril_mask([time, total], start as i64, &q.device())
            .unsqueeze::<4>()
            .expand([b, h, time, total])
    });
    attention(q, k, v, mask, None, options)
}
