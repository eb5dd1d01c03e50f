//! The 256-bit x86 body of the Q6_K product, one for three instruction sets: AVX-512 VNNI (a
//! call's unpaired last group; `zmm.rs` pairs the others) and AVX-VNNI (`vpdpbusd`), and AVX2 (`vpmaddubsw` then `vpmaddwd` by ones, exact here: a level is at most
//! 63, so a byte pair's sum stays within 16 bits). Each 32-byte load of a group's `ql` or `qh`
//! holds the same 4 bytes of the 8 rows; the levels of one part are assembled from a nibble of
//! `ql` and a bit pair of `qh`, and one instruction per activation row adds 4 products to each
//! row's lane. A 16-value sub-block's 4 words leave lane `j` with row `j`'s exact dot product,
//! from which the body takes the activation offset and which it scales by the row's sub-block
//! scale (`vpmulld`), as the rule does.

use std::arch::x86_64::*;

use super::rule::{GroupQ6K, Q6KRows, SUBS, SUPER};
use crate::nn::quant::simd::{
    self, Dpbusd, Operands, broadcast4, group_body, prefetch_step, store,
};

/// `vpdpbusd` on AVX2: `vpmaddubsw`, then `vpmaddwd` by ones. Exact only while a byte pair's
/// products fit 16 bits (unsigned bytes below 128, as Q6_K's levels are).
struct Maddubs;

impl Dpbusd for Maddubs {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: by the contract, AVX2 is enabled here.
        unsafe {
            let pairs = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// Lane `j`: row `j`'s scale of sub-block `s`, as i32.
///
/// # Safety
/// AVX2 must be enabled by the caller.
#[inline(always)]
unsafe fn scale(block: &GroupQ6K, s: usize) -> __m256i {
    // SAFETY: word `s / 4` of the scales is 32 readable bytes; AVX2 by the contract.
    unsafe {
        let word = _mm256_loadu_si256(block.scales.as_ptr().add(32 * (s / 4)).cast());
        let top = _mm256_sllv_epi32(word, _mm256_set1_epi32(24 - 8 * (s % 4) as i32));
        _mm256_srai_epi32::<24>(top)
    }
}

/// The levels of the 4 parts for word `k` of half `h`: part `p`'s lane `j` holds row `j`'s
/// levels of weights `128h + 32p + 4k .. + 4`. One load each of the two `ql` words and the `qh`
/// word they share.
///
/// # Safety
/// AVX2 must be enabled by the caller.
#[inline(always)]
unsafe fn levels(block: &GroupQ6K, h: usize, k: usize) -> [__m256i; 4] {
    // SAFETY: the words read lie within `ql` (16 words) and `qh` (8); AVX2 by the contract.
    unsafe {
        let (low, high) = (_mm256_set1_epi8(15), _mm256_set1_epi8(0x30));
        let ql = block.ql.as_ptr();
        let a = _mm256_loadu_si256(ql.add(32 * (16 * h + k)).cast());
        let b = _mm256_loadu_si256(ql.add(32 * (16 * h + 8 + k)).cast());
        let hb = _mm256_loadu_si256(block.qh.as_ptr().add(32 * (8 * h + k)).cast());
        // Bits 2p, 2p + 1 of each byte to bits 4, 5 (16-bit shifts: what crosses a byte
        // boundary lands outside the masks).
        let join = |lo: __m256i, hi: __m256i| {
            _mm256_or_si256(_mm256_and_si256(lo, low), _mm256_and_si256(hi, high))
        };
        [
            join(a, _mm256_slli_epi16::<4>(hb)),
            join(b, _mm256_slli_epi16::<2>(hb)),
            join(_mm256_srli_epi16::<4>(a), hb),
            join(_mm256_srli_epi16::<4>(b), _mm256_srli_epi16::<2>(hb)),
        ]
    }
}

/// Group `g`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs from `o0`).
///
/// # Safety
/// `D`'s extension, AVX2, FMA and F16C must be available and enabled by the caller; `weight`
/// holds group `g`'s `blocks` super-blocks and `x` rows `r .. r + R`.
#[inline(always)]
pub(super) unsafe fn tile<D: Dpbusd, const R: usize>(
    op: &Operands<'_, GroupQ6K, Q6KRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let w = op.group(g);
    let rows: [(&[f32], &[i8], &[i32]); R] = std::array::from_fn(|t| op.x.row(r + t));
    // SAFETY (every intrinsic and helper below): the caller enables AVX2, FMA, F16C and `D`'s
    // extension; the loads stay within the group super-block and the rows' blocks.
    unsafe {
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, block) in w.iter().enumerate() {
            let xs: [*const i8; R] =
                std::array::from_fn(|t| rows[t].1[b * SUPER..][..SUPER].as_ptr());
            let offs: [&[i32]; R] = std::array::from_fn(|t| &rows[t].2[b * SUBS..][..SUBS]);
            let mut isum = [zero; R];
            for h in 0..2 {
                for half in 0..2 {
                    // Row t's dot products of the 4 parts' sub-blocks `8h + 2p + half`.
                    let mut dot = [[zero; 4]; R];
                    for k in 4 * half..4 * half + 4 {
                        prefetch_step(block, 8 * h + k, 16);
                        let q = levels(block, h, k);
                        for (t, d) in dot.iter_mut().enumerate() {
                            for (p, dp) in d.iter_mut().enumerate() {
                                let x = broadcast4(xs[t].add(128 * h + 32 * p + 4 * k));
                                *dp = D::dpbusd(*dp, q[p], x);
                            }
                        }
                    }
                    let sub = |p: usize| 8 * h + 2 * p + half;
                    let scales: [__m256i; 4] = std::array::from_fn(|p| scale(block, sub(p)));
                    for (t, d) in dot.iter().enumerate() {
                        for (p, (&dp, &sv)) in d.iter().zip(&scales).enumerate() {
                            let off = _mm256_set1_epi32(offs[t][sub(p)]);
                            let centred = _mm256_sub_epi32(dp, off);
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(centred, sv));
                        }
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(block.d.as_ptr().cast()));
            for t in 0..R {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(rows[t].0[b]));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), scale, acc[t]);
            }
        }
        store::<_, 8, R, _, _>(&acc, op, (g, r), out);
    }
}

group_body!(
    /// The rule's product with AVX-VNNI: the same bits.
    matmul_rows_avxvnni(GroupQ6K, Q6KRows), "avx2,fma,f16c,avxvnni", [1, 2],
    |op, out, g, r, R| tile::<simd::AvxVnni, R>(op, out, g, r)
);

group_body!(
    /// The rule's product with AVX2: the same bits.
    matmul_rows_avx2(GroupQ6K, Q6KRows), "avx2,fma,f16c", [1, 2],
    |op, out, g, r, R| tile::<Maddubs, R>(op, out, g, r)
);
