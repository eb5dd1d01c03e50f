//! Small vectorizable f32 primitives (exp, max, sum-exp, dot) and runtime CPU dispatch.
//!
//! The primitives are written with fixed-width lane arrays so the compiler vectorizes them; the
//! [`multiversion!`] macro compiles a hot function twice (baseline and AVX2+FMA) and picks the
//! best at run time, so no `-C target-cpu` flag is needed.

/// Lane count of the manual reductions (two AVX2 registers, one AVX-512 register).
pub(crate) const LANES: usize = 16;

/// Define a function whose body is compiled for the baseline target and, on x86-64, also for
/// AVX2+FMA, choosing at run time. The body is generic over `$m: MulAdd` ([`Fused`] in the
/// AVX2+FMA build, [`Unfused`] otherwise). Arguments must be plain (non-generic) types.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident<$m:ident>($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn inner<$m: $crate::sampling::fastmath::MulAdd>($($arg: $ty),*) $(-> $ret)? $body
            $crate::sampling::fastmath::dispatch_avx2!(inner($($arg: $ty),*) $(-> $ret)?)
        }
    };
}
pub(crate) use multiversion;

/// [`multiversion!`] with a third build for CPUs with AVX-512 (F+VL): the same AVX2 code, but
/// compiled with 32 vector registers (no spills of the `exp` constants) and `popcnt`. Same bits:
/// only the register allocation and the encodings change, not the operations.
macro_rules! multiversion512 {
    ($(#[$meta:meta])* $vis:vis fn $name:ident<$m:ident>($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn inner<$m: $crate::sampling::fastmath::MulAdd>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,avx512f,avx512vl,popcnt")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    inner::<$crate::sampling::fastmath::Fused>($($arg),*)
                }
                if $crate::sampling::fastmath::has_avx512() {
                    // SAFETY: `has_avx512` checked that this CPU supports these features.
                    return unsafe { avx512($($arg),*) };
                }
            }
            $crate::sampling::fastmath::dispatch_avx2!(inner($($arg: $ty),*) $(-> $ret)?)
        }
    };
}
pub(crate) use multiversion512;

/// The tail both macros share: call `inner::<Fused>` in an AVX2+FMA build when the CPU has it,
/// else `inner::<Unfused>` (expands to the function's final expression).
macro_rules! dispatch_avx2 {
    ($inner:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)?) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                $inner::<$crate::sampling::fastmath::Fused>($($arg),*)
            }
            if $crate::sampling::fastmath::has_avx2() {
                // SAFETY: `has_avx2` checked that this CPU supports AVX2 and FMA.
                return unsafe { avx2($($arg),*) };
            }
        }
        $inner::<$crate::sampling::fastmath::Unfused>($($arg),*)
    }};
}
pub(crate) use dispatch_avx2;

/// `a·b + c`, fused or not. The fused form is only used where FMA instructions are enabled
/// (elsewhere `f32::mul_add` would be a slow library call).
pub(crate) trait MulAdd {
    /// `a·b + c`.
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// Fused multiply-add (one rounding).
pub(crate) struct Fused;

/// Separate multiply and add.
pub(crate) struct Unfused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `true` when the CPU supports AVX2 and FMA (cached by the standard library).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// `true` when the CPU also supports AVX-512 F+VL and `popcnt` (see [`multiversion512!`]).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("popcnt")
}

/// `e^x` in f32 with about 1 ulp of error over the normal range; exactly `0.0` for
/// `x < -87.3` (including `-inf`), `+inf` above 88.7 (NaN gives a tiny positive value: callers
/// detect NaNs separately). Branch-free and free of float→int casts (which do not vectorize).
#[inline(always)]
pub(crate) fn exp_with<M: MulAdd>(x: f32) -> f32 {
    let [lo, hi, log2e, ln2_hi, ln2_lo, round, p0, p1, p2, p3, p4, p5] = EXP_CONSTS;
    let xc = if x > lo { x } else { lo };
    let xc = if xc < hi { xc } else { hi };
    let t = M::mul_add(xc, log2e, round);
    let n = t - round;
    let r = M::mul_add(n, -ln2_lo, M::mul_add(n, -ln2_hi, xc));
    let mut p = p0;
    p = M::mul_add(p, r, p1);
    p = M::mul_add(p, r, p2);
    p = M::mul_add(p, r, p3);
    p = M::mul_add(p, r, p4);
    p = M::mul_add(p, r, p5);
    let y = M::mul_add(p, r * r, r) + 1.0;
    // 2^n from the integer held in t's low mantissa bits (n is within [-126, 128]; 128 gives
    // +inf, the right answer above ln(f32::MAX)).
    let n_int = t.to_bits().wrapping_sub(round.to_bits()) as i32;
    let e = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    let v = y * e;
    if x < lo { 0.0 } else { v }
}

/// Constants of [`exp_with`] (shared with the SIMD version): clamp bounds, `log2 e`, `ln 2`
/// split hi/lo, the rounding constant `1.5·2^23`, and the polynomial coefficients.
pub(crate) const EXP_CONSTS: [f32; 12] = [
    -87.3,
    88.7,
    std::f32::consts::LOG2_E,
    0.693_359_4,
    -2.121_944_4e-4,
    12_582_912.0,
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// [`exp_with`] without FMA (for code outside [`multiversion!`] functions).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    exp_with::<Unfused>(x)
}

/// Maximum of a block (NaN-ignoring) and the number of NaNs in it.
#[inline(always)]
pub(crate) fn max_and_nans(x: &[f32]) -> (f32, u32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are available (checked at run time).
        return unsafe { super::simd::max_and_nans(x) };
    }
    max_and_nans_portable(x)
}

/// Portable [`max_and_nans`].
#[inline(always)]
pub(crate) fn max_and_nans_portable(x: &[f32]) -> (f32, u32) {
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

/// `Σ exp((x - m) · s)` over a block, in f32 lanes (AVX2 when the CPU has it: on such a CPU
/// every caller gets the same bits, whichever `M` it was compiled with).
#[inline(always)]
pub(crate) fn sum_exp<M: MulAdd>(x: &[f32], m: f32, s: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are available (checked at run time).
        return unsafe { super::simd::sum_exp(x, m, s) };
    }
    sum_exp_portable::<M>(x, m, s)
}

/// Portable [`sum_exp`].
#[inline(always)]
pub(crate) fn sum_exp_portable<M: MulAdd>(x: &[f32], m: f32, s: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += exp_with::<M>((c[i] - m) * s);
        }
    }
    let mut t: f32 = acc.iter().sum();
    for &v in tail {
        t += exp_with::<M>((v - m) * s);
    }
    t
}

/// Dot product in f32 lanes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with::<Unfused>(a, b)
}

/// Dot product in f32 lanes, with `M`'s multiply-add.
#[inline(always)]
pub(crate) fn dot_with<M: MulAdd>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = M::mul_add(x[i], y[i], acc[i]);
        }
    }
    let mut t: f32 = acc.iter().sum();
    for (x, y) in ta.iter().zip(tb) {
        t += x * y;
    }
    t
}

/// `out[b] = w · e_b` for `N` vectors `e_b = e[b·r..(b+1)·r]`, `r = w.len()`: 8 lanes over the
/// chunks of 8, reduced as `((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7))`, then the tail in order. The
/// reference for the AVX2 kernel in `bias.rs`, which computes the same bits.
#[inline(always)]
pub(crate) fn dots_portable<M: MulAdd, const N: usize>(w: &[f32], e: &[f32], out: &mut [f32; N]) {
    let r = w.len();
    let mut acc = [[0f32; 8]; N];
    let full = r / 8 * 8;
    let mut c = 0;
    while c < full {
        let wv = &w[c..c + 8];
        for (b, a) in acc.iter_mut().enumerate() {
            let ev = &e[b * r + c..b * r + c + 8];
            for l in 0..8 {
                a[l] = M::mul_add(wv[l], ev[l], a[l]);
            }
        }
        c += 8;
    }
    for (b, o) in out.iter_mut().enumerate() {
        let a = &acc[b];
        let mut t = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        for k in full..r {
            t = M::mul_add(w[k], e[b * r + k], t);
        }
        *o = t;
    }
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
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_with::<Fused>(x), exp(x));
            assert!(((a - b) / b).abs() < 4e-7);
            x += 0.0371;
        }
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
        let s = sum_exp::<Unfused>(&x, m, 0.5);
        let want: f64 = x.iter().map(|&v| (f64::from(v - m) * 0.5).exp()).sum();
        assert!((f64::from(s) - want).abs() / want < 1e-5);
        let mut out = [0f32; 3];
        dots_portable::<Unfused, 3>(&x[..37], &x[..111], &mut out);
        for (b, o) in out.iter().enumerate() {
            let want: f64 = (0..37).map(|j| f64::from(x[j] * x[b * 37 + j])).sum();
            assert!((f64::from(*o) - want).abs() < 1e-3 * want.abs().max(1.0));
        }
        let d = dot(&x, &x[1..]);
        let want: f64 = x.iter().zip(&x[1..]).map(|(a, b)| f64::from(a * b)).sum();
        assert!((f64::from(d) - want).abs() / want.abs().max(1.0) < 1e-4);
    }
}
