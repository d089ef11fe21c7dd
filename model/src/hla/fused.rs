//! What the fused chunk-parallel forms (first and second order, [`super::first`] and
//! [`super::second`]) share on CPU devices: when they run, the decay inside a chunk, the
//! walk over the chunks of every sequence and head, and the one packed output that carries
//! the outputs and the final state through autodiff.
//!
//! A fused form walks the chunks of each sequence and head in order and carries the state
//! from one chunk to the next (the recurrence over chunks, spec §5), each chunk's products
//! being small matmuls; sequences and heads run in parallel. Its backward pass walks the
//! chunks back, from the states saved at every chunk start.

use burn::prelude::*;

use super::HlaInput;
use crate::fused::simd::exp;

/// Whether `input` takes a fused form: f32 on a CPU device, keys per head (not shared), and
/// gates that need no gradient (none, or the fixed decay).
pub(crate) fn applies(input: &HlaInput) -> bool {
    crate::fused::applies(&input.q)
        && input.k.dims()[1] == input.q.dims()[1]
        && input.log_g.as_ref().is_none_or(|g| !g.is_tracked())
}

/// `input`'s log gates, or zeros `[1, 1, time]` (no decay).
pub(crate) fn log_gates(input: &HlaInput) -> Tensor<3> {
    input.log_g.clone().unwrap_or_else(|| {
        let device = input.q.device();
        Tensor::zeros([1, 1, input.time()], &device)
    })
}

/// Outputs `o` and the final state tensors `[batch, heads, rows, cols]` from a packed
/// output: `o` (`[batch, heads, time, dv]`, or the token-major `[batch, time, d]` of the
/// fused mixer) then each state, every part contiguous.
pub(crate) fn unpack<const D: usize>(
    packed: Tensor<1>,
    o: [usize; D],
    states: &[[usize; 4]],
) -> (Tensor<D>, Vec<Tensor<4>>) {
    let mut offset = 0;
    let mut part = |len: usize| {
        let t = packed.clone().narrow(0, offset, len);
        offset += len;
        t
    };
    let o = part(o.iter().product()).reshape(o);
    let states = states
        .iter()
        .map(|&dims| part(dims.iter().product()).reshape(dims))
        .collect();
    (o, states)
}

/// One sequence and head's inputs: `q`, `k` `[time, d]`, `v` `[time, dv]` row-major and
/// the log gates `[time]`.
pub(crate) struct Head<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) log_g: &'a [f32],
}

impl Head<'_> {
    /// `q`, `k`, `v` of the `c` tokens from `c0`.
    #[inline(always)]
    pub(crate) fn chunk(
        &self,
        (c0, c): (usize, usize),
        d: usize,
        dv: usize,
    ) -> (&[f32], &[f32], &[f32]) {
        (
            &self.q[c0 * d..][..c * d],
            &self.k[c0 * d..][..c * d],
            &self.v[c0 * dv..][..c * dv],
        )
    }
}

/// The sizes of a fused call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) time: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    pub(crate) chunk: usize,
    /// Batch and heads of the gates (each 1 or the full size).
    pub(crate) gates: (usize, usize),
}

impl Sizes {
    pub(crate) fn new(q: &[usize], v: &[usize], gates: &[usize], chunk: usize) -> Self {
        Self {
            batch: q[0],
            heads: q[1],
            time: q[2],
            d: q[3],
            dv: v[3],
            chunk,
            gates: (gates[0], gates[1]),
        }
    }

    /// Sequences × heads.
    pub(crate) fn sequences(&self) -> usize {
        self.batch * self.heads
    }

    pub(crate) fn chunks(&self) -> usize {
        self.time.div_ceil(self.chunk)
    }

    /// The log gates `[time]` of sequence-and-head `i` in `log_g [gb, gh, time]`.
    pub(crate) fn gates_of<'a>(&self, log_g: &'a [f32], i: usize) -> &'a [f32] {
        let (b, h) = (i / self.heads, i % self.heads);
        let (gb, gh) = self.gates;
        let row = (if gb > 1 { b } else { 0 }) * gh + if gh > 1 { h } else { 0 };
        &log_g[row * self.time..][..self.time]
    }

    /// The chunks of one sequence as `(first token, tokens)`.
    pub(crate) fn spans(&self) -> impl DoubleEndedIterator<Item = (usize, usize)> + use<> {
        let (time, chunk) = (self.time, self.chunk);
        (0..time.div_ceil(chunk)).map(move |n| (n * chunk, chunk.min(time - n * chunk)))
    }
}

/// The decay inside one chunk (spec §6), from its log gates with `b_τ = Σ_{s≤τ} log g_s`:
/// `a_τ = exp(b_τ)`, `e_τ = exp(b_last − b_τ)`, `ρ = a_last` and the mask
/// `D_{τσ} = exp(b_τ − b_σ)` for `σ ≤ τ`, else 0 (row-major, `len × len`); with their
/// squares, which second order needs.
pub(crate) struct ChunkDecay {
    pub(crate) a: Vec<f32>,
    pub(crate) e: Vec<f32>,
    pub(crate) rho: f32,
    pub(crate) mask: Vec<f32>,
    pub(crate) a2: Vec<f32>,
    pub(crate) e2: Vec<f32>,
    pub(crate) mask2: Vec<f32>,
}

impl ChunkDecay {
    #[inline(always)]
    pub(crate) fn new(log_g: &[f32]) -> Self {
        let len = log_g.len();
        let mut b = Vec::with_capacity(len);
        let mut total = 0.0f32;
        for &g in log_g {
            total += g;
            b.push(total);
        }
        let mut mask = vec![0.0; len * len];
        for (t, row) in mask.chunks_exact_mut(len).enumerate() {
            for (s, m) in row[..=t].iter_mut().enumerate() {
                *m = exp(b[t] - b[s]);
            }
        }
        // Loops, not `collect`: the exponentials stay in the caller's vectorized code.
        let (mut a, mut e) = (vec![0.0; len], vec![0.0; len]);
        for ((a, e), &b) in a.iter_mut().zip(&mut e).zip(&b) {
            *a = exp(b);
            *e = exp(total - b);
        }
        let square = |x: &[f32]| {
            let mut x = x.to_vec();
            for x in &mut x {
                *x *= *x;
            }
            x
        };
        Self {
            a2: square(&a),
            e2: square(&e),
            mask2: square(&mask),
            a,
            e,
            rho: exp(total),
            mask,
        }
    }
}

/// The decay of the last chunk seen, made again only when the gates change: with the
/// fixed decay (or none) every full chunk has the same gates, so a head computes its
/// exponentials once instead of once per chunk.
#[derive(Default)]
pub(crate) struct Decays {
    gates: Vec<f32>,
    decay: Option<ChunkDecay>,
}

impl Decays {
    /// The decay of the chunk whose log gates are `log_g`.
    #[inline(always)]
    pub(crate) fn of(&mut self, log_g: &[f32]) -> &ChunkDecay {
        // Written out (no `get_or_insert_with` closure) so that `ChunkDecay::new` is inlined
        // into the caller's vectorized code.
        if self.decay.is_none() || self.gates != log_g {
            self.gates.clear();
            self.gates.extend_from_slice(log_g);
            self.decay = Some(ChunkDecay::new(log_g));
        }
        match &self.decay {
            Some(decay) => decay,
            None => unreachable!("made above"),
        }
    }
}

/// `out_r = f_r · x_r` for the rows `x_r` of `x` (`cols` wide).
#[inline(always)]
pub(crate) fn scale_rows(out: &mut [f32], x: &[f32], cols: usize, f: &[f32]) {
    for ((out, x), &f) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)).zip(f) {
        for (o, x) in out.iter_mut().zip(x) {
            *o = f * x;
        }
    }
}

/// `x ← x ⊙ mask`.
#[inline(always)]
pub(crate) fn apply_mask(x: &mut [f32], mask: &[f32]) {
    for (x, m) in x.iter_mut().zip(mask) {
        *x *= m;
    }
}

/// `x ← f · x`.
#[inline(always)]
pub(crate) fn scale(x: &mut [f32], f: f32) {
    for x in x {
        *x *= f;
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, TensorData};

    use super::*;
    use crate::compare::relative_rms_error;
    use crate::hla::{DEFAULT_DECAY_BASE, first, fixed_log_gates, multi_scale_decay, second};

    /// The fused and the composed forms of one order on the same input and initial state:
    /// `(o, final state)`.
    type Run = fn(&HlaInput, Vec<Tensor<4>>, usize) -> (Tensor<4>, Vec<Tensor<4>>);

    fn first_order(composed: bool) -> Run {
        if composed {
            |x, s, c| {
                let (o, s) = first::chunked_composed(x, first::State { s: s[0].clone() }, c);
                (o, vec![s.s])
            }
        } else {
            |x, s, c| {
                let (o, s) = first::chunked(x, first::State { s: s[0].clone() }, c);
                (o, vec![s.s])
            }
        }
    }

    fn second_state(s: &[Tensor<4>]) -> second::State {
        second::State {
            s: s[0].clone(),
            z: s[1].clone(),
        }
    }

    fn second_order(composed: bool) -> Run {
        if composed {
            |x, s, c| {
                let (o, s) = second::chunked_composed(x, second_state(&s), c);
                (o, vec![s.s, s.z])
            }
        } else {
            |x, s, c| {
                let (o, s) = second::chunked(x, second_state(&s), c);
                (o, vec![s.s, s.z])
            }
        }
    }

    fn random<const D: usize>(dims: [usize; D], scale: f64, device: &Device) -> Tensor<D> {
        (Tensor::random(dims, Distribution::Normal(0.0, 1.0), device) * scale)
            .detach()
            .require_grad()
    }

    /// Outputs, final states and the gradients of q, k, v and the initial state, fused
    /// against composed: no gates, the fixed decay, and per-token gates per sequence and
    /// head or shared by the batch (none needing a gradient); ragged lengths; chunks of 1,
    /// 16 and 64; d ≠ dv.
    #[test]
    fn fused_chunked_forms_equal_the_composed_ones() {
        let (b, h, d, dv) = (2, 3, 5, 4);
        for device in crate::fused::tests::devices() {
            for (name, run, state_dims) in [
                ("first", first_order as fn(bool) -> Run, vec![[b, h, d, dv]]),
                ("second", second_order, vec![[b, h, d, d], [b, h, d, dv]]),
            ] {
                for time in [1, 17, 64, 130] {
                    let gates = [
                        None,
                        Some(
                            fixed_log_gates(
                                &multi_scale_decay(h, DEFAULT_DECAY_BASE),
                                time,
                                &device,
                            )
                            .unwrap(),
                        ),
                        Some(Tensor::random(
                            [b, h, time],
                            Distribution::Uniform(-0.3, 0.0),
                            &device,
                        )),
                        Some(Tensor::random(
                            [1, h, time],
                            Distribution::Uniform(-0.3, 0.0),
                            &device,
                        )),
                    ];
                    for (g, log_g) in gates.into_iter().enumerate() {
                        for chunk in [1, 16, 64] {
                            let scale = 1.0 / (d as f64).sqrt();
                            let (q, k) = (
                                random([b, h, time, d], scale, &device),
                                random([b, h, time, d], scale, &device),
                            );
                            let v = random([b, h, time, dv], 1.0, &device);
                            let init: Vec<Tensor<4>> = state_dims
                                .iter()
                                .map(|&s| random(s, 0.3, &device))
                                .collect();
                            let input =
                                HlaInput::new(q.clone(), k.clone(), v.clone(), log_g.clone())
                                    .unwrap();
                            assert!(applies(&input), "the fused form must run");
                            let case = format!("{name} T={time} gates {g} chunk {chunk}");
                            let mut results = Vec::new();
                            for composed in [false, true] {
                                let (o, states) = run(composed)(&input, init.clone(), chunk);
                                let weight = |x: &Tensor<4>| {
                                    let n: usize = x.dims().iter().product();
                                    let values: Vec<f32> = (0..n)
                                        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
                                        .collect();
                                    Tensor::<1>::from_data(TensorData::new(values, [n]), &device)
                                        .reshape(x.dims())
                                };
                                let mut loss = (o.clone() * weight(&o)).sum();
                                for s in &states {
                                    loss = loss + (s.clone() * weight(s)).sum();
                                }
                                let grads = loss.backward();
                                let mut out = vec![o.inner()];
                                out.extend(states.iter().map(|s| s.clone().inner()));
                                for x in [&q, &k, &v].into_iter().chain(&init) {
                                    out.push(x.grad(&grads).expect("a gradient"));
                                }
                                results.push(out);
                            }
                            for (i, (fused, composed)) in
                                results[0].iter().zip(&results[1]).enumerate()
                            {
                                let error = relative_rms_error(fused.clone(), composed.clone());
                                assert!(
                                    error < 1e-4,
                                    "{case}, result {i}: relative RMS error {error:e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
