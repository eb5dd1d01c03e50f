//! The Q4_K quantizer's search for a sub-block's `(scale, min)`: 21 level assignments around the
//! plain range's, each refitted by least squares, the one with the least squared error kept.
//!
//! The candidates are independent, so they run side by side: lane `s` of every array below is
//! candidate `s`, and each lane adds its sums in the weights' order, as a candidate searched on
//! its own would (the tests hold the bits to a one-candidate-at-a-time oracle). A sum's chain of
//! dependent additions was the whole cost of the one-at-a-time search (loading a 0.6 B model
//! with `dtype="q4_k"` took 26 s on 2 threads); across lanes they vectorize, and the search runs
//! 4.5x as fast (`cargo bench --bench quant_rows -- quantize`, EPYC AVX2). On x86-64 the same
//! body runs compiled for AVX2 where present: no fused multiply-adds, so the same bits.

use super::rule::SUB;

/// Candidates searched.
const STEPS: usize = 21;

/// Lanes: the candidates padded to whole 8-lane vectors (the padding is never chosen).
const LANES: usize = 24;

/// `v` rounded to a level in `0..=15` (`v + 0.5` truncated; below 0, and NaN, give 0): the
/// quantizer's `level(v, 15)`, in arithmetic that vectorizes.
#[inline(always)]
pub(super) fn level15(v: f32) -> u8 {
    // `max` first: NaN gives 0. The checked `as` casts would not vectorize (a compare and
    // select per lane for NaN and the range).
    #[allow(clippy::manual_clamp, reason = "`clamp` keeps NaN, which must give 0")]
    let clamped = (v + 0.5).max(0.0).min(15.0);
    // SAFETY: `clamped` is in `0.0..=15.0`, not NaN: representable as an i32.
    unsafe { clamped.to_int_unchecked::<i32>() as u8 }
}

/// The least-squares `(scale, offset)` with `x ≈ scale · q + offset`, `offset ≤ 0`, from the
/// levels' sums (`n` weights, `Σq`, `Σq²`, `Σx`, `Σqx`); `None` when no positive scale fits.
#[inline(always)]
pub(super) fn solve(n: f32, sq: f32, sqq: f32, sx: f32, sqx: f32) -> Option<(f32, f32)> {
    let det = n * sqq - sq * sq;
    let (mut a, mut b) = if det > 0.0 {
        ((n * sqx - sq * sx) / det, (sqq * sx - sq * sqx) / det)
    } else {
        (0.0, 0.0)
    };
    if b > 0.0 {
        b = 0.0;
        a = if sqq > 0.0 { sqx / sqq } else { 0.0 };
    }
    (a > 0.0 && a.is_finite() && b.is_finite()).then_some((a, b))
}

/// The search's body (see the module docs), inlined into each compiled copy.
#[inline(always)]
fn search(x: &[f32], lo: f32, hi: f32, mut best: (f32, f32, f32)) -> (f32, f32) {
    // Plain loops, not `array::from_fn`: its closures are compiled apart, without AVX2.
    let mut iscale = [0.0f32; LANES];
    for (s, v) in iscale.iter_mut().enumerate() {
        *v = (14.0 + 0.1 * s as f32) / (hi - lo);
    }
    let mut q = [[0.0f32; LANES]; SUB];
    let (mut sq, mut sqq, mut sqx) = ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
    let mut sx = 0.0f32;
    for (&v, ql) in x.iter().zip(q.iter_mut()) {
        sx += v;
        let from_lo = v - lo;
        for s in 0..LANES {
            let l = f32::from(level15(iscale[s] * from_lo));
            ql[s] = l;
            sq[s] += l;
            sqq[s] += l * l;
            sqx[s] += l * v;
        }
    }
    let n = x.len() as f32;
    let (mut a, mut b, mut fits) = ([0.0f32; LANES], [0.0f32; LANES], [false; LANES]);
    for s in 0..LANES {
        if let Some(fit) = solve(n, sq[s], sqq[s], sx, sqx[s]) {
            (a[s], b[s], fits[s]) = (fit.0, fit.1, true);
        }
    }
    let mut err = [0.0f32; LANES];
    for (&v, ql) in x.iter().zip(&q) {
        for s in 0..LANES {
            let e = a[s] * ql[s] + b[s] - v;
            err[s] += e * e;
        }
    }
    for s in 0..STEPS {
        if fits[s] && err[s] < best.2 {
            best = (a[s], -b[s], err[s]);
        }
    }
    (best.0, best.1)
}

/// [`search`] compiled for AVX2.
///
/// # Safety
/// AVX2 must be present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn search_avx2(x: &[f32], lo: f32, hi: f32, best: (f32, f32, f32)) -> (f32, f32) {
    search(x, lo, hi, best)
}

/// One sub-block's `(scale, min)`, both `≥ 0`, for `x ≈ scale · q − min` with `q` in `0..=15`
/// (`x`: at most [`SUB`] finite values).
pub fn fit_sub(x: &[f32]) -> (f32, f32) {
    fit_sub_with(x, true)
}

/// [`fit_sub`] in its portable copy (the tests hold both copies to the oracle).
#[cfg(test)]
pub(super) fn fit_sub_portable(x: &[f32]) -> (f32, f32) {
    fit_sub_with(x, false)
}

/// [`fit_sub`], through the AVX2 copy where `vector` is set and AVX2 is present.
fn fit_sub_with(x: &[f32], vector: bool) -> (f32, f32) {
    let x = &x[..x.len().min(SUB)];
    let lo = x.iter().fold(0.0f32, |m, &v| m.min(v));
    let hi = x.iter().fold(lo, |m, &v| m.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    // The fallback: every weight at the range's low end (scale 0), and its squared error.
    let plain = (
        0.0f32,
        -lo,
        x.iter()
            .map(|&v| (v - lo) * (v - lo))
            .fold(0.0f32, |s, e| s + e),
    );
    #[cfg(target_arch = "x86_64")]
    if vector && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return unsafe { search_avx2(x, lo, hi, plain) };
    }
    let _ = vector;
    search(x, lo, hi, plain)
}
