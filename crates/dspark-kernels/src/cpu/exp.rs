//! `e^x` in f32: the branch-free polynomial every kernel shares (the SIMD bodies use the same
//! constants, so the portable and vector versions give the same bits).

use super::{MulAdd, Unfused};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Fused;

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
}
