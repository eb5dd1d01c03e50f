//! Small vectorizable f32 primitives (exp, max, sum-exp, dot) and runtime CPU dispatch.
//!
//! The primitives are written with fixed-width lane arrays so the compiler vectorizes them; the
//! [`multiversion!`] macro compiles a hot function twice (baseline and AVX2+FMA) and picks the
//! best at run time, so no `-C target-cpu` flag is needed.

/// Lane count of the manual reductions (two AVX2 registers, one AVX-512 register).
pub(crate) const LANES: usize = 16;

/// Define a function whose body is compiled for the baseline target and, on x86-64, also for
/// AVX2+FMA, choosing at run time. Arguments must be plain (non-generic) types.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn inner($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    inner($($arg),*)
                }
                if $crate::sampling::fastmath::has_avx2() {
                    // SAFETY: `has_avx2` checked that this CPU supports AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            inner($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// `true` when the CPU supports AVX2 and FMA (cached by the standard library).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// `e^x` in f32 with about 1 ulp of error over the normal range; exactly `0.0` for
/// `x < -87.3` (including `-inf`), `+inf` above 88.7. Branch-free so that loops vectorize.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.3, 88.7);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n through the exponent bits (n is within [-126, 128] after the clamp).
    let e = f32::from_bits(((n as i32 + 127).clamp(0, 255) as u32) << 23);
    let v = y * e;
    if x < -87.3 {
        0.0
    } else if x > 88.7 {
        f32::INFINITY
    } else {
        v
    }
}

/// Maximum of a block (NaN-ignoring) and the number of NaNs in it.
#[inline(always)]
pub(crate) fn max_and_nans(x: &[f32]) -> (f32, u32) {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut nan = [0u32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            let v = c[i];
            m[i] = if v > m[i] { v } else { m[i] };
            nan[i] += u32::from(v.is_nan());
        }
    }
    let mut best = m
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let mut nans: u32 = nan.iter().sum();
    for &v in tail {
        best = if v > best { v } else { best };
        nans += u32::from(v.is_nan());
    }
    (best, nans)
}

/// `Σ exp((x - m) · s)` over a block, in f32 lanes.
#[inline(always)]
pub(crate) fn sum_exp(x: &[f32], m: f32, s: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += exp((c[i] - m) * s);
        }
    }
    let mut t: f32 = acc.iter().sum();
    for &v in tail {
        t += exp((v - m) * s);
    }
    t
}

/// Dot product in f32 lanes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut t: f32 = acc.iter().sum();
    for (x, y) in ta.iter().zip(tb) {
        t += x * y;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_and_handles_edges() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = f64::from(exp(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn reductions_match_scalar() {
        let x: Vec<f32> = (0..301)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let (m, nans) = max_and_nans(&x);
        assert_eq!(m, x.iter().cloned().fold(f32::MIN, f32::max));
        assert_eq!(nans, 0);
        let mut y = x.clone();
        y[17] = f32::NAN;
        y[300] = f32::NAN;
        assert_eq!(max_and_nans(&y).1, 2);
        let s = sum_exp(&x, m, 0.5);
        let want: f64 = x.iter().map(|&v| (f64::from(v - m) * 0.5).exp()).sum();
        assert!((f64::from(s) - want).abs() / want < 1e-5);
        let d = dot(&x, &x[1..]);
        let want: f64 = x.iter().zip(&x[1..]).map(|(a, b)| f64::from(a * b)).sum();
        assert!((f64::from(d) - want).abs() / want.abs().max(1.0) < 1e-4);
    }
}
