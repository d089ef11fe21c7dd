//! Elementwise math written so that loops over it vectorize, [`multiversion!`] to compile a
//! kernel for the widest SIMD the CPU has (AVX-512, AVX2 or the baseline, chosen at run
//! time), and the driver that runs a kernel in pieces on the rayon pool.

use rayon::prelude::*;

/// Elements per parallel piece: large enough that a task outweighs its scheduling.
pub(crate) const PIECE: usize = 1 << 15;

/// Rows per piece for rows of `len` elements.
pub(crate) fn rows_per_piece(len: usize) -> usize {
    (PIECE / len.max(1)).max(1)
}

/// Runs `f` for every piece, in parallel when there are several.
pub(crate) fn run<T: Send>(pieces: impl IntoParallelIterator<Item = T>, f: impl Fn(T) + Sync) {
    pieces.into_par_iter().for_each(&f);
}

/// The widest vector extension this CPU has: 4 (AVX-512), 3 (AVX2 and FMA) or 0.
#[inline]
pub(crate) fn level() -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            return 4;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return 3;
        }
    }
    0
}

/// `fn name(args) body` compiled three times, for AVX-512, for AVX2 and FMA, and for the
/// baseline, and run in the widest version [`level`] allows. The body and what it calls
/// must inline (`#[inline(always)]` helpers) to be vectorized for the wider units.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                fn v4($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn v3($($arg: $ty),*) {
                    body($($arg),*)
                }
                match $crate::backend::simd::level() {
                    // SAFETY: the CPU has the features these versions are compiled for.
                    4 => return unsafe { v4($($arg),*) },
                    3 => return unsafe { v3($($arg),*) },
                    _ => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// `e^x`, within 2 ulp of the exact value on [−87, 88] (Cephes' `expf`: `x = n ln 2 + r`,
/// a degree-6 polynomial in `r`, `2^n` built in the exponent bits); clamped outside. Adding
/// 1.5·2²³ rounds `x log₂e` to the integer `n` and leaves `n` in the low mantissa bits, so
/// every step vectorizes (`floor` and a saturating float-to-int cast may not).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0;
    // ln 2 in two parts, so that `x − n ln 2` is exact for the first.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// `Σ a_i b_i` in 16 lanes, so that it vectorizes (a sum in order would not).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let (a_rest, b_rest) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_rest
        .remainder()
        .iter()
        .zip(b_rest.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (a, b) in a_rest.zip(b_rest) {
        for i in 0..LANES {
            acc[i] += a[i] * b[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The largest of `x` (−∞ when empty), in 16 lanes.
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [f32::NEG_INFINITY; LANES];
    let rest = x.chunks_exact(LANES);
    let mut best = rest
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    for x in rest {
        for i in 0..LANES {
            if x[i] > acc[i] {
                acc[i] = x[i];
            }
        }
    }
    for a in acc {
        if a > best {
            best = a;
        }
    }
    best
}

/// `Σ x`, in 16 lanes.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let rest = x.chunks_exact(LANES);
    let tail: f32 = rest.remainder().iter().sum();
    for x in rest {
        for i in 0..LANES {
            acc[i] += x[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `σ(x) = 1 / (1 + e^−x)`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0.0f64;
        for i in -86_999..88_000 {
            let x = i as f32 * 1e-3 - 1.234e-4;
            let want = (x as f64).exp();
            worst = worst.max(((exp(x) as f64 - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert!(exp(1000.0).is_finite());
    }

    #[test]
    fn sigmoid_saturates_without_nan() {
        assert!((0.0..1e-37).contains(&sigmoid(-1e9)));
        assert_eq!(sigmoid(1e9), 1.0);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
    }
}
