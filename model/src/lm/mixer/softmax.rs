//! The softmax mixer's composed path: causal attention with RoPE over a KV cache.

use burn::prelude::*;

use super::{Memory, Mixer, split3};
use crate::lm::attention::causal_attention;

impl Mixer {
    /// Causal softmax attention with RoPE over the cached and new tokens.
    pub(super) fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        memory: Option<Memory>,
    ) -> (Tensor<4>, Memory) {
        let rope = |x: Tensor<4>, start| match &self.rope {
            Some(rope) => rope.apply(x, start),
            None => x,
        };
        let (past_k, past_v) = match memory {
            None => (None, None),
            Some(Memory::Cache { k, v }) => (Some(k), Some(v)),
            Some(Memory::Projected(qkv)) => {
                let widths = [0, 1, 2].map(|_| qkv.dims()[2] / 3);
                let (_, k, v) = split3(qkv, widths);
                (Some(rope(self.heads(k), 0)), Some(self.heads(v)))
            }
            Some(Memory::Recurrent(_) | Memory::Packed { .. }) => {
                unreachable!("a recurrent state passed to softmax")
            }
        };
        let start = past_k.as_ref().map_or(0, |k| k.dims()[2]);
        let (q, k) = (rope(q, start), rope(k, start));
        let k = past_k.map_or(k.clone(), |past| Tensor::cat(vec![past, k], 2));
        let v = past_v.map_or(v.clone(), |past| Tensor::cat(vec![past, v], 2));
        let o = causal_attention(q, k.clone(), v.clone(), start);
        (o, Memory::Cache { k, v })
    }

    /// RoPE's `(cos, sin)` table for positions `0..time`, `[time, d_head, 2]`; without RoPE
    /// (learned positions) the identity rotation, so the CPU kernel serves both.
    #[cfg(cpu_kernels)]
    pub(super) fn rope_table(&self, time: usize, device: &Device) -> Tensor<3> {
        match &self.rope {
            Some(rope) => rope.freq_complex.clone().narrow(0, 0, time),
            None => {
                let part = [time, self.settings.d_head, 1];
                Tensor::cat(
                    vec![Tensor::ones(part, device), Tensor::zeros(part, device)],
                    2,
                )
            }
        }
    }
}
