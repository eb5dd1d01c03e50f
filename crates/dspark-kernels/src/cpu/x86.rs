//! Explicit AVX2+FMA versions of the hot row reductions.
//!
//! The fixed-width lane loops in [`super::reduce`] are only partly auto-vectorized; these
//! intrinsic versions compute bit-identical results (same per-lane arithmetic, same lane
//! assignment, same final reduction order as the `Fused` portable code) several times faster.
//! Callers reach them through `reduce`, which checks the CPU at run time.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::{
    __m256, _CMP_LT_OQ, _CMP_UNORD_Q, _mm256_add_ps, _mm256_blendv_ps, _mm256_castps_si256,
    _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_max_ps,
    _mm256_min_ps, _mm256_movemask_ps, _mm256_mul_ps, _mm256_set1_epi32, _mm256_set1_ps,
    _mm256_setzero_ps, _mm256_slli_epi32, _mm256_storeu_ps, _mm256_sub_epi32, _mm256_sub_ps,
};

use super::exp::{EXP_CONSTS, exp_with};
use super::{Fused, LANES};

/// `e^x` on 8 lanes, the same operations as [`exp_with::<Fused>`].
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let [lo, hi, log2e, ln2_hi, ln2_lo, round, p0, p1, p2, p3, p4, p5] = EXP_CONSTS;
    let xc = _mm256_max_ps(x, _mm256_set1_ps(lo)); // NaN → lo, as `if x > lo { x } else { lo }`
    let xc = _mm256_min_ps(xc, _mm256_set1_ps(hi));
    let t = _mm256_fmadd_ps(xc, _mm256_set1_ps(log2e), _mm256_set1_ps(round));
    let n = _mm256_sub_ps(t, _mm256_set1_ps(round));
    let r = _mm256_fmadd_ps(
        n,
        _mm256_set1_ps(-ln2_lo),
        _mm256_fmadd_ps(n, _mm256_set1_ps(-ln2_hi), xc),
    );
    let mut p = _mm256_set1_ps(p0);
    for c in [p1, p2, p3, p4, p5] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    // (t − round) + 127 in one wrapping subtraction: the same integer as the portable code.
    let biased = _mm256_sub_epi32(
        _mm256_castps_si256(t),
        _mm256_set1_epi32((round.to_bits() as i32).wrapping_sub(127)),
    );
    let e = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased));
    let v = _mm256_mul_ps(y, e);
    let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(lo));
    _mm256_blendv_ps(v, _mm256_setzero_ps(), below)
}

/// `Σ exp((x − m)·s)`; same lanes and reduction order as the portable `sum_exp::<Fused>`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sum_exp(x: &[f32], m: f32, s: f32) -> f32 {
    let (mv, sv) = (_mm256_set1_ps(m), _mm256_set1_ps(s));
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        // SAFETY: `c` holds LANES = 16 values.
        let [v0, v1] = unsafe { load16(c.as_ptr()) };
        a0 = _mm256_add_ps(a0, exp8(_mm256_mul_ps(_mm256_sub_ps(v0, mv), sv)));
        a1 = _mm256_add_ps(a1, exp8(_mm256_mul_ps(_mm256_sub_ps(v1, mv), sv)));
    }
    let mut t = reduce16([a0, a1]);
    for &v in tail {
        t += exp_with::<Fused>((v - m) * s);
    }
    t
}

/// Maximum (NaN-ignoring) and NaN count; same result as the portable `max_and_nans`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn max_and_nans(x: &[f32]) -> (f32, u32) {
    let (mut m0, mut m1) = (
        _mm256_set1_ps(f32::NEG_INFINITY),
        _mm256_set1_ps(f32::NEG_INFINITY),
    );
    let mut nans = 0u32;
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        // SAFETY: `c` holds LANES = 16 values.
        let [v0, v1] = unsafe { load16(c.as_ptr()) };
        // max(v, m) returns m when v is NaN: `if v > m { v } else { m }`.
        m0 = _mm256_max_ps(v0, m0);
        m1 = _mm256_max_ps(v1, m1);
        nans += (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v0, v0)).count_ones())
            + (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v1, v1)).count_ones());
    }
    let mut best = lanes16([m0, m1])
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    for &v in tail {
        best = if v > best { v } else { best };
        nans += u32::from(v.is_nan());
    }
    (best, nans)
}

/// Defines the two residual kernels for the target features `$features` (the same code is
/// built for AVX2+FMA and, with 32 registers, for AVX-512 F+VL: same operations, same bits).
macro_rules! residual_kernels {
    ($features:literal, $residual:ident, $scaled:ident) => {
        /// `Σ max(p_v − q_v, 0)` with `p_v = exp((x_v − p[0])·p[1])·p[2]` and `q_v` likewise from `y`
        /// and `q`: the residual mass of one block. Same lanes and reduction order as the portable
        /// `block_residual` of `residual.rs` compiled with [`Fused`], hence the same bits.
        ///
        /// # Safety
        /// The CPU must support the features of this build (see the `residual_kernels!` calls).
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $residual(x: &[f32], y: &[f32], p: [f32; 3], q: [f32; 3]) -> f32 {
            let n = x.len().min(y.len());
            let (x, y) = (&x[..n], &y[..n]);
            let ([pm, ps, pz], [qm, qs, qz]) = (splat3(p), splat3(q));
            let zero = _mm256_setzero_ps();
            let mut acc = [zero, zero];
            let cx = x.chunks_exact(LANES);
            let cy = y.chunks_exact(LANES);
            let (tx, ty) = (cx.remainder(), cy.remainder());
            for (a, b) in cx.zip(cy) {
                for (h, lane) in acc.iter_mut().enumerate() {
                    // SAFETY: `a` and `b` hold 16 values each, two loads of 8.
                    let (va, vb) = unsafe {
                        (
                            _mm256_loadu_ps(a.as_ptr().add(8 * h)),
                            _mm256_loadu_ps(b.as_ptr().add(8 * h)),
                        )
                    };
                    let pv = _mm256_mul_ps(exp8(_mm256_mul_ps(_mm256_sub_ps(va, pm), ps)), pz);
                    let qv = _mm256_mul_ps(exp8(_mm256_mul_ps(_mm256_sub_ps(vb, qm), qs)), qz);
                    // max(r, 0) returns 0 for r <= 0 and for NaN, as `if r > 0 { r } else { 0 }`.
                    *lane = _mm256_add_ps(*lane, _mm256_max_ps(_mm256_sub_ps(pv, qv), zero));
                }
            }
            let mut t = reduce16(acc);
            for (&a, &b) in tx.iter().zip(ty) {
                let r = exp_with::<Fused>((a - p[0]) * p[1]) * p[2]
                    - exp_with::<Fused>((b - q[0]) * q[1]) * q[2];
                t += if r > 0.0 { r } else { 0.0 };
            }
            t
        }

        /// the residual kernel for a proposal that is zero on the whole block (`y` all `-inf`):
        /// `Σ exp((x_v − p[0])·p[1])·p[2]`, the same bits without the proposal's exponentials.
        ///
        /// # Safety
        /// The CPU must support the features of this build (see the `residual_kernels!` calls).
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $scaled(x: &[f32], p: [f32; 3]) -> f32 {
            let [pm, ps, pz] = splat3(p);
            let zero = _mm256_setzero_ps();
            let mut acc = [zero, zero];
            let cx = x.chunks_exact(LANES);
            let tx = cx.remainder();
            for a in cx {
                for (h, lane) in acc.iter_mut().enumerate() {
                    // SAFETY: `a` holds 16 values, two loads of 8.
                    let va = unsafe { _mm256_loadu_ps(a.as_ptr().add(8 * h)) };
                    // `p_v − 0` is `p_v` and `max(p_v, 0)` is `p_v` (never NaN, never negative).
                    let pv = _mm256_mul_ps(exp8(_mm256_mul_ps(_mm256_sub_ps(va, pm), ps)), pz);
                    *lane = _mm256_add_ps(*lane, pv);
                }
            }
            let mut t = reduce16(acc);
            for &a in tx {
                t += exp_with::<Fused>((a - p[0]) * p[1]) * p[2];
            }
            t
        }
    };
}

residual_kernels!("avx2,fma", residual_sum, scaled_exp_sum);
residual_kernels!(
    "avx2,fma,avx512f,avx512vl,popcnt",
    residual_sum_512,
    scaled_exp_sum_512
);

/// Each of the three values on every lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn splat3(v: [f32; 3]) -> [__m256; 3] {
    [
        _mm256_set1_ps(v[0]),
        _mm256_set1_ps(v[1]),
        _mm256_set1_ps(v[2]),
    ]
}

/// Sum of the 16 lanes of two registers, in lane order (as `acc.iter().sum()`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce16(acc: [__m256; 2]) -> f32 {
    lanes16(acc).iter().sum()
}

/// The 16 lanes of two registers, in order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lanes16(acc: [__m256; 2]) -> [f32; LANES] {
    let mut lanes = [0f32; LANES];
    // SAFETY: `lanes` has room for 16 values.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
    }
    lanes
}

/// The 16 values at `p` as two registers of 8.
///
/// # Safety
/// `p` points to 16 readable `f32`s.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load16(p: *const f32) -> [__m256; 2] {
    // SAFETY: by the caller's contract, two loads of 8.
    unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{has_avx2, max_and_nans_portable, sum_exp_portable};

    fn data() -> Vec<f32> {
        let mut x: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 2003) as f32 - 1000.0) * 0.11)
            .collect();
        x[3] = f32::NEG_INFINITY;
        x[40] = f32::NAN;
        x[41] = 1e30;
        x[999] = f32::NAN;
        x
    }

    #[test]
    fn bit_identical_to_portable() {
        if !has_avx2() {
            return;
        }
        let x = data();
        for len in [0, 5, 16, 17, 256, 1000] {
            let block = &x[..len];
            // SAFETY: AVX2+FMA checked above.
            let (fast, slow) = (unsafe { max_and_nans(block) }, max_and_nans_portable(block));
            assert_eq!(fast.0.to_bits(), slow.0.to_bits());
            assert_eq!(fast.1, slow.1);
            let finite: Vec<f32> = block
                .iter()
                .map(|&v| if v.is_nan() { 0.0 } else { v })
                .collect();
            for (m, s) in [(0.0f32, 1.0f32), (50.0, 0.7), (1e30, 1.0)] {
                // SAFETY: as above.
                let fast = unsafe { sum_exp(&finite, m, s) };
                let slow = sum_exp_portable::<Fused>(&finite, m, s);
                assert_eq!(fast.to_bits(), slow.to_bits(), "len {len} m {m} s {s}");
            }
        }
    }
}
