//! The AVX-512 body of the Q6_K product: `x86.rs`'s walk on 512-bit vectors, two groups side by
//! side (lanes 0–7: group `g`'s rows, 8–15: group `g + 1`'s), as the Q8_0 and Q4_K bodies pair
//! them: each word pair and activation row's 4 bytes give one `vpdpbusd` for 16 outputs. A
//! call's last group, when it has no pair, runs the 256-bit body with AVX-512 VNNI.

use std::arch::x86_64::*;

use super::rule::{GroupQ6K, Q6KRows, SUBS, SUPER};
use super::x86;
use crate::nn::quant::simd::{self, Operands, pair_body, store};
use crate::nn::quant::zmm::pair_f16;

/// Word `w` (32 bytes: the same 4 bytes of the 8 rows) of two groups' byte arrays, group `a`'s
/// in lanes 0–7.
///
/// # Safety
/// Both pointers hold at least `32 (w + 1)` readable bytes; AVX-512 F is enabled by the caller.
#[inline(always)]
unsafe fn pair<T>(a: *const T, b: *const T, w: usize) -> __m512i {
    // SAFETY: by the contract.
    unsafe {
        let lo = _mm256_loadu_si256(a.cast::<u8>().add(32 * w).cast());
        let hi = _mm256_loadu_si256(b.cast::<u8>().add(32 * w).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// Lane `j`: row `j`'s (of group `b0`, then `b1`) scale of sub-block `s`, as i32.
///
/// # Safety
/// AVX-512 F must be enabled by the caller.
#[inline(always)]
unsafe fn scale(b0: &GroupQ6K, b1: &GroupQ6K, s: usize) -> __m512i {
    // SAFETY: word `s / 4` of the 128 scale bytes; AVX-512 F by the contract.
    unsafe {
        let word = pair(b0.scales.as_ptr(), b1.scales.as_ptr(), s / 4);
        let top = _mm512_sllv_epi32(word, _mm512_set1_epi32(24 - 8 * (s % 4) as i32));
        _mm512_srai_epi32::<24>(top)
    }
}

/// The 4 parts' levels for word `k` of half `h` of both groups (`x86::levels` on 16 rows).
///
/// # Safety
/// AVX-512 F and BW must be enabled by the caller.
#[inline(always)]
unsafe fn levels(b0: &GroupQ6K, b1: &GroupQ6K, h: usize, k: usize) -> [__m512i; 4] {
    // SAFETY: the words read lie within `ql` (16 words) and `qh` (8); the extensions by the
    // contract.
    unsafe {
        let (low, high) = (_mm512_set1_epi8(15), _mm512_set1_epi8(0x30));
        let (q0, q1) = (b0.ql.as_ptr(), b1.ql.as_ptr());
        let a = pair(q0, q1, 16 * h + k);
        let b = pair(q0, q1, 16 * h + 8 + k);
        let hb = pair(b0.qh.as_ptr(), b1.qh.as_ptr(), 8 * h + k);
        let join = |lo: __m512i, hi: __m512i| {
            _mm512_or_si512(_mm512_and_si512(lo, low), _mm512_and_si512(hi, high))
        };
        [
            join(a, _mm512_slli_epi16::<4>(hb)),
            join(b, _mm512_slli_epi16::<2>(hb)),
            join(_mm512_srli_epi16::<4>(a), hb),
            join(_mm512_srli_epi16::<4>(b), _mm512_srli_epi16::<2>(hb)),
        ]
    }
}

/// Groups `g` and `g + 1`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs
/// from `o0`).
///
/// # Safety
/// AVX-512 F, BW and VNNI, AVX2, FMA and F16C must be enabled by the caller; `weight` holds
/// groups `g` and `g + 1`'s `blocks` super-blocks and `x` rows `r .. r + R`.
#[inline(always)]
unsafe fn pair_tile<const R: usize>(
    op: &Operands<'_, GroupQ6K, Q6KRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let (w0, w1) = (op.group(g), op.group(g + 1));
    let rows: [(&[f32], &[i8], &[i32]); R] = std::array::from_fn(|t| op.x.row(r + t));
    // SAFETY (every intrinsic and helper below): the caller enables the extensions; the loads
    // stay within the group super-blocks and the rows' blocks.
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); R];
        for (b, (b0, b1)) in w0.iter().zip(w1).enumerate() {
            let ahead = op.pair_ahead(g, b);
            let xs: [*const i8; R] =
                std::array::from_fn(|t| rows[t].1[b * SUPER..][..SUPER].as_ptr());
            let offs: [&[i32]; R] = std::array::from_fn(|t| &rows[t].2[b * SUBS..][..SUBS]);
            let mut isum = [zero; R];
            for h in 0..2 {
                for half in 0..2 {
                    let mut dot = [[zero; 4]; R];
                    for k in 4 * half..4 * half + 4 {
                        ahead.step(8 * h + k, 16);
                        let q = levels(b0, b1, h, k);
                        for (t, d) in dot.iter_mut().enumerate() {
                            for (p, dp) in d.iter_mut().enumerate() {
                                let at = xs[t].add(128 * h + 32 * p + 4 * k);
                                let x = _mm512_set1_epi32(at.cast::<i32>().read_unaligned());
                                *dp = _mm512_dpbusd_epi32(*dp, q[p], x);
                            }
                        }
                    }
                    let sub = |p: usize| 8 * h + 2 * p + half;
                    let scales: [__m512i; 4] = std::array::from_fn(|p| scale(b0, b1, sub(p)));
                    for (t, d) in dot.iter().enumerate() {
                        for (p, (&dp, &sv)) in d.iter().zip(&scales).enumerate() {
                            let off = _mm512_set1_epi32(offs[t][sub(p)]);
                            let centred = _mm512_sub_epi32(dp, off);
                            isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(centred, sv));
                        }
                    }
                }
            }
            let dw = pair_f16(&b0.d, &b1.d);
            for t in 0..R {
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(rows[t].0[b]));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, acc[t]);
            }
        }
        store::<_, 16, R, _, _>(&acc, op, (g, r), out);
    }
}

pair_body!(
    /// The rule's product with AVX-512 VNNI on 512-bit vectors (the 256-bit body for an
    /// unpaired last group): the same bits.
    matmul_rows(GroupQ6K, Q6KRows), [1, 2, 3, 4],
    |op, out, g, r, R| pair_tile::<R>(op, out, g, r),
    x86::tile::<simd::Avx512Vnni, R>(op, out, g, r)
);
