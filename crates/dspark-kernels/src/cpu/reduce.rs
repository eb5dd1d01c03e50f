//! Vectorizable reductions over f32 blocks (max with NaN count, sum of exponentials, dot
//! products), each dispatched to its AVX2 body ([`super::x86`]) when the CPU has it.

use super::exp::exp_with;
use super::{LANES, MulAdd, Unfused, has_avx2};

/// Maximum of a block (NaN-ignoring) and the number of NaNs in it.
#[inline(always)]
pub(crate) fn max_and_nans(x: &[f32]) -> (f32, u32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA are available (checked at run time).
        return unsafe { super::x86::max_and_nans(x) };
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
        return unsafe { super::x86::sum_exp(x, m, s) };
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
    zip_lanes(
        &a[..n],
        &b[..n],
        |s, x, y| M::mul_add(x, y, s),
        |x, y| x * y,
    )
}

/// `Σ` over the pairs of `a` and `b` in the fixed order the portable references share: lane
/// `i` of [`LANES`] keeps `s_i = lane(s_i, a_v, b_v)` over the chunks of [`LANES`] (zipped),
/// the lanes are summed in order, then `tail(a_v, b_v)` is added for each pair of the two
/// remainders in order.
#[inline(always)]
pub(crate) fn zip_lanes(
    a: &[f32],
    b: &[f32],
    lane: impl Fn(f32, f32, f32) -> f32,
    tail: impl Fn(f32, f32) -> f32,
) -> f32 {
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = lane(acc[i], x[i], y[i]);
        }
    }
    let mut t: f32 = acc.iter().sum();
    for (&x, &y) in ta.iter().zip(tb) {
        t += tail(x, y);
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
    use crate::cpu::Unfused;

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
