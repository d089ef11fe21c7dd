//! The inputs of one HLA call, validated once.

use burn::prelude::*;

/// A shape mistake in [`HlaInput::new`] or [`fixed_log_gates`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HlaError {
    #[error("{name} has shape {got:?}, expected {expected}")]
    Shape {
        name: &'static str,
        got: Vec<usize>,
        expected: String,
    },
    #[error("a fixed decay must lie in (0, 1], got {0}")]
    Decay(f64),
}

/// Queries, keys, values and optional log gates of one call, per head.
#[derive(Debug, Clone)]
pub struct HlaInput {
    /// Queries `[batch, heads, time, d]`.
    pub(crate) q: Tensor<4>,
    /// Keys `[batch, heads or 1, time, d]`; one head means shared across heads.
    pub(crate) k: Tensor<4>,
    /// Values `[batch, heads, time, dv]`.
    pub(crate) v: Tensor<4>,
    /// Log gates `log g_t ≤ 0`, `[batch or 1, heads or 1, time]`.
    pub(crate) log_g: Option<Tensor<3>>,
}

impl HlaInput {
    /// Checks the shapes: `q [B,H,T,d]`, `k [B,H or 1,T,d]`, `v [B,H,T,dv]`,
    /// `log_g [B or 1,H or 1,T]` (gates `g = exp(log_g)` in (0, 1]; `None`: no decay).
    pub fn new(
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        log_g: Option<Tensor<3>>,
    ) -> Result<Self, HlaError> {
        let [b, h, t, d] = q.dims();
        let one_or = |x: usize, n: usize| x == n || x == 1;
        let [kb, kh, kt, kd] = k.dims();
        if kb != b || !one_or(kh, h) || kt != t || kd != d {
            return Err(shape_error(
                "k",
                &k.dims(),
                format!("[{b}, {h} or 1, {t}, {d}]"),
            ));
        }
        let [vb, vh, vt, _] = v.dims();
        if (vb, vh, vt) != (b, h, t) {
            return Err(shape_error("v", &v.dims(), format!("[{b}, {h}, {t}, dv]")));
        }
        if let Some(g) = &log_g {
            let [gb, gh, gt] = g.dims();
            if !one_or(gb, b) || !one_or(gh, h) || gt != t {
                let expected = format!("[{b} or 1, {h} or 1, {t}]");
                return Err(shape_error("log_g", &g.dims(), expected));
            }
        }
        Ok(Self { q, k, v, log_g })
    }

    /// Queries `[batch, heads, time, d]`.
    pub fn q(&self) -> &Tensor<4> {
        &self.q
    }

    /// Keys `[batch, heads or 1, time, d]`.
    pub fn k(&self) -> &Tensor<4> {
        &self.k
    }

    /// Values `[batch, heads, time, dv]`.
    pub fn v(&self) -> &Tensor<4> {
        &self.v
    }

    /// Log gates `[batch or 1, heads or 1, time]`, if any.
    pub fn log_g(&self) -> Option<&Tensor<3>> {
        self.log_g.as_ref()
    }

    /// Tokens `[from, to)` of every tensor.
    pub(crate) fn span(&self, from: usize, to: usize) -> Self {
        Self {
            q: self.q.clone().slice(s![.., .., from..to, ..]),
            k: self.k.clone().slice(s![.., .., from..to, ..]),
            v: self.v.clone().slice(s![.., .., from..to, ..]),
            log_g: self.log_g.clone().map(|g| g.slice(s![.., .., from..to])),
        }
    }

    pub(crate) fn time(&self) -> usize {
        self.q.dims()[2]
    }

    /// The log gates, or zeros `[1, 1, time]` (no decay): the kernels' gates argument.
    pub(crate) fn gates_or_zeros(&self) -> Tensor<3> {
        self.log_g
            .clone()
            .unwrap_or_else(|| Tensor::zeros([1, 1, self.time()], &self.q.device()))
    }

    /// Heads of the key moment `S`: one only when both keys and gates are shared.
    pub(crate) fn key_state_heads(&self) -> usize {
        let gate_heads = self.log_g.as_ref().map_or(1, |g| g.dims()[1]);
        self.k.dims()[1].max(gate_heads)
    }
}

/// The base `b` of RetNet's multi-scale decay.
pub const DEFAULT_DECAY_BASE: f64 = 5.0;

/// A multi-scale decay, `γ_h = 1 − 2^(−b−h)` for heads `h = 0, 1, …` (RetNet: `b = 5`):
/// head `h` forgets on a scale of about `2^(b+h)` tokens.
pub fn multi_scale_decay(heads: usize, base: f64) -> Vec<f64> {
    (0..heads)
        .map(|h| 1.0 - 2f64.powf(-base - h as f64))
        .collect()
}

/// Log gates `[1, heads, time]` of a fixed decay `γ_h` per head.
pub fn fixed_log_gates(
    gammas: &[f64],
    time: usize,
    device: &Device,
) -> Result<Tensor<3>, HlaError> {
    if let Some(&bad) = gammas.iter().find(|&&g| !(g > 0.0 && g <= 1.0)) {
        return Err(HlaError::Decay(bad));
    }
    let logs: Vec<f32> = gammas.iter().map(|g| g.ln() as f32).collect();
    let per_head = Tensor::<1>::from_floats(logs.as_slice(), device);
    Ok(per_head
        .reshape([1, gammas.len(), 1])
        .expand([1, gammas.len(), time]))
}

fn shape_error(name: &'static str, got: &[usize], expected: String) -> HlaError {
    HlaError::Shape {
        name,
        got: got.to_vec(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_scale_decay_follows_its_base() {
        let retnet: Vec<f64> = (5..9).map(|e| 1.0 - 1.0 / f64::from(1 << e)).collect();
        assert_eq!(multi_scale_decay(4, DEFAULT_DECAY_BASE), retnet);
        assert_eq!(multi_scale_decay(3, 1.0), [0.5, 0.75, 0.875]);
        assert_eq!(multi_scale_decay(1, 2.5), [1.0 - 2f64.powf(-2.5)]);
    }
}
