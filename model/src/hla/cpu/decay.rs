//! The decay inside one chunk of a CPU chunk kernel (docs/math.md §6), its gradient with respect to the
//! chunk's log gates, and the small row operations the chunk kernels share.
//!
//! With `b_τ = Σ_{s≤τ} log g_s` counted from the chunk's start, every decay factor is
//! `exp(p · (linear in b))` for a power `p`: `a^p_τ = exp(p b_τ)`, `e^p_τ = exp(p (b_last −
//! b_τ))`, `ρ^p = exp(p b_last)` and `D^p_{τσ} = exp(p (b_τ − b_σ))` for `σ ≤ τ`. So the
//! gradient of `b` gathers, from each factor `f`, `p · f · ∂f` with the sign of its `b`s
//! ([`DecayGrads`]), and that of the gates is its sum from the end,
//! `∂ log g_s = Σ_{τ≥s} ∂b_τ`.

use crate::backend::simd::{dot, exp};

/// The factors of one power `p` of a chunk's decay: `a^p`, `e^p`, `ρ^p` and the mask `D^p`
/// (row-major, `len × len`, zero above the diagonal).
pub(crate) struct Power {
    pub(crate) a: Vec<f32>,
    pub(crate) e: Vec<f32>,
    pub(crate) rho: f32,
    pub(crate) mask: Vec<f32>,
}

/// The decay of one chunk in powers `1..=max`.
pub(crate) struct ChunkDecay {
    powers: Vec<Power>,
}

impl ChunkDecay {
    #[inline(always)]
    fn new(log_g: &[f32], max: usize) -> Self {
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
        let first = Power {
            a,
            e,
            rho: exp(total),
            mask,
        };
        let mut powers = Vec::with_capacity(max);
        powers.push(first);
        while powers.len() < max {
            let (one, last) = (&powers[0], &powers[powers.len() - 1]);
            let times = |x: &[f32], y: &[f32]| {
                let mut out = x.to_vec();
                for (o, y) in out.iter_mut().zip(y) {
                    *o *= y;
                }
                out
            };
            let next = Power {
                a: times(&last.a, &one.a),
                e: times(&last.e, &one.e),
                rho: last.rho * one.rho,
                mask: times(&last.mask, &one.mask),
            };
            powers.push(next);
        }
        Self { powers }
    }

    /// The factors of power `p` (1 to the `max` this decay was made with).
    #[inline(always)]
    pub(crate) fn p(&self, p: usize) -> &Power {
        &self.powers[p - 1]
    }
}

/// The decay of the last chunk seen, made again only when the gates change: with the
/// fixed decay (or none) every full chunk has the same gates, so a head computes its
/// exponentials once instead of once per chunk.
pub(crate) struct Decays {
    max: usize,
    gates: Vec<f32>,
    decay: Option<ChunkDecay>,
}

impl Decays {
    /// Decays in powers `1..=max`.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            gates: Vec::new(),
            decay: None,
        }
    }

    /// The decay of the chunk whose log gates are `log_g`.
    #[inline(always)]
    pub(crate) fn of(&mut self, log_g: &[f32]) -> &ChunkDecay {
        // Written out (no `get_or_insert_with` closure) so that `ChunkDecay::new` is inlined
        // into the caller's vectorized code.
        if self.decay.is_none() || self.gates != log_g {
            self.gates.clear();
            self.gates.extend_from_slice(log_g);
            self.decay = Some(ChunkDecay::new(log_g, self.max));
        }
        match &self.decay {
            Some(decay) => decay,
            None => unreachable!("made above"),
        }
    }
}

/// The gradient `∂b` of one chunk's cumulative log gates, gathered factor by factor from
/// `w = f ⊙ ∂f` (each factor times its gradient).
pub(crate) struct DecayGrads {
    db: Vec<f32>,
}

impl DecayGrads {
    pub(crate) fn new(len: usize) -> Self {
        Self { db: vec![0.0; len] }
    }

    /// From `a^p_τ = exp(p b_τ)`.
    #[inline(always)]
    pub(crate) fn since_start(&mut self, p: usize, w: &[f32]) {
        for (db, w) in self.db.iter_mut().zip(w) {
            *db += p as f32 * w;
        }
    }

    /// From `e^p_τ = exp(p (b_last − b_τ))`.
    #[inline(always)]
    pub(crate) fn until_end(&mut self, p: usize, w: &[f32]) {
        let mut total = 0.0;
        for (db, w) in self.db.iter_mut().zip(w) {
            *db -= p as f32 * w;
            total += w;
        }
        self.whole(p, total);
    }

    /// From `ρ^p = exp(p b_last)`.
    #[inline(always)]
    pub(crate) fn whole(&mut self, p: usize, w: f32) {
        if let Some(last) = self.db.last_mut() {
            *last += p as f32 * w;
        }
    }

    /// From the mask `D^p_{τσ} = exp(p (b_τ − b_σ))`, given `w = D^p ⊙ ∂D^p` (`len × len`).
    #[inline(always)]
    pub(crate) fn mask(&mut self, p: usize, w: &[f32]) {
        let len = self.db.len();
        let p = p as f32;
        for (t, row) in w.chunks_exact(len).enumerate() {
            for (s, &w) in row[..=t].iter().enumerate() {
                self.db[t] += p * w;
                self.db[s] -= p * w;
            }
        }
    }

    /// The gradient of the chunk's log gates, `∂ log g_s = Σ_{τ≥s} ∂b_τ`, into `out`.
    #[inline(always)]
    pub(crate) fn finish(&self, out: &mut [f32]) {
        let mut total = 0.0;
        for (out, db) in out.iter_mut().zip(&self.db).rev() {
            total += db;
            *out = total;
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

/// `diag(f) x` as a new matrix (rows `cols` wide).
#[inline(always)]
pub(crate) fn scaled_rows(x: &[f32], cols: usize, f: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    scale_rows(&mut out, x, cols, f);
    out
}

/// `x ← x ⊙ mask`.
#[inline(always)]
pub(crate) fn apply_mask(x: &mut [f32], mask: &[f32]) {
    for (x, m) in x.iter_mut().zip(mask) {
        *x *= m;
    }
}

/// `x ⊙ y` as a new matrix.
#[inline(always)]
pub(crate) fn hadamard(x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    apply_mask(&mut out, y);
    out
}

/// `X + Xᵀ` of a square `x` (`n × n`): the gradient a product with `X` on both sides
/// (`K X Kᵀ`, the state `S`) gives it.
#[inline(always)]
pub(crate) fn symmetrized(x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            out[i * n + j] = x[i * n + j] + x[j * n + i];
        }
    }
    out
}

/// `x ← f · x`.
#[inline(always)]
pub(crate) fn scale(x: &mut [f32], f: f32) {
    for x in x {
        *x *= f;
    }
}

/// `x_r · y_r` for the rows of `x` and `y` (`cols` wide): with `x` a decay-scaled factor
/// `diag(f) X` and `y` the gradient of `X`'s product, this is `f ⊙ ∂f`.
#[inline(always)]
pub(crate) fn row_dots(x: &[f32], y: &[f32], cols: usize) -> Vec<f32> {
    let rows = x.chunks_exact(cols).zip(y.chunks_exact(cols));
    rows.map(|(x, y)| dot(x, y)).collect()
}
