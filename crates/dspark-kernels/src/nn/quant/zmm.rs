//! The AVX-512 body of the Q8_0 product: the VNNI body (`vnni.rs`) on 512-bit vectors, two
//! groups side by side (lanes 0–7: group `g`'s rows, 8–15: group `g + 1`'s). Word `k` of both
//! group-blocks fills one vector, and each activation row's 4 bytes (one broadcast for all 16
//! lanes) give one `vpdpbusd` for 16 outputs: half the instructions of two 256-bit ones, and
//! this CPU family runs a 512-bit `vpdpbusd` at the rate of a 256-bit one. A call's last group,
//! when it has no pair, runs the 256-bit VNNI body.

use std::arch::x86_64::*;

use super::acts::QuantRows;
use super::rule::{BLOCK, GroupQ8};
use super::simd::{self, Operands, pair_body, store};
use super::vnni;

/// Word `k` (bytes `32k .. 32k + 32`) of two group-blocks' bytes, in one vector.
///
/// # Safety
/// AVX-512 F must be enabled by the caller.
#[inline(always)]
pub(crate) unsafe fn pair_word(a: &[u8], b: &[u8], k: usize) -> __m512i {
    // SAFETY: both are at least 32 (k + 1) bytes (the callers' blocks); AVX-512 F by the
    // contract.
    unsafe {
        let lo = _mm256_loadu_si256(a[32 * k..][..32].as_ptr().cast());
        let hi = _mm256_loadu_si256(b[32 * k..][..32].as_ptr().cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// Two groups' 8 f16 factors (16 bytes each) as 16 floats.
///
/// # Safety
/// AVX-512 F must be enabled by the caller.
#[inline(always)]
pub(crate) unsafe fn pair_f16(a: &[half::f16; 8], b: &[half::f16; 8]) -> __m512 {
    // SAFETY: 16 readable bytes each; AVX-512 F by the contract.
    unsafe {
        let lo = _mm_loadu_si128(a.as_ptr().cast());
        let hi = _mm_loadu_si128(b.as_ptr().cast());
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
    }
}

/// Groups `g` and `g + 1`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs
/// from `o0`).
///
/// # Safety
/// AVX-512 F, BW and VNNI, FMA and F16C must be enabled by the caller; `weight` holds groups
/// `g` and `g + 1`'s `blocks` blocks and `x` rows `r .. r + R`.
#[inline(always)]
unsafe fn pair_tile<const R: usize>(
    op: &Operands<'_, GroupQ8, QuantRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let (w0, w1) = (op.group(g), op.group(g + 1));
    let rows: [(&[f32], &[i8], &[i32]); R] = std::array::from_fn(|t| op.x.row(r + t));
    // SAFETY (every intrinsic below): the caller enables the extensions; the loads stay within
    // the group-blocks and the rows' blocks.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [_mm512_setzero_ps(); R];
        for (b, (b0, b1)) in w0.iter().zip(w1).enumerate() {
            let ahead = op.pair_ahead(g, b);
            let (q0, q1) = (bytes_of(b0), bytes_of(b1));
            let mut sums: [__m512i; R] =
                std::array::from_fn(|t| _mm512_set1_epi32(-128 * rows[t].2[b]));
            for k in 0..BLOCK / 4 {
                ahead.step(k, BLOCK / 4);
                let word = _mm512_xor_si512(pair_word(q0, q1, k), flip);
                for (sum, (_, xq, _)) in sums.iter_mut().zip(&rows) {
                    let p = xq.as_ptr().add(b * BLOCK + 4 * k);
                    let xb = _mm512_set1_epi32(p.cast::<i32>().read_unaligned());
                    *sum = _mm512_dpbusd_epi32(*sum, word, xb);
                }
            }
            let dw = pair_f16(&b0.d, &b1.d);
            for (t, (xd, _, _)) in rows.iter().enumerate() {
                // `d_w · d_x` rounded once, per output.
                let s = _mm512_mul_ps(dw, _mm512_set1_ps(xd[b]));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t]), s, acc[t]);
            }
        }
        store::<_, 16, R, _, _>(&acc, op, (g, r), out);
    }
}

/// A group-block's 256 interleaved bytes.
#[inline(always)]
fn bytes_of(block: &GroupQ8) -> &[u8] {
    // SAFETY: i8 and u8 have one layout.
    unsafe { std::slice::from_raw_parts(block.qs.as_ptr().cast(), block.qs.len()) }
}

pair_body!(
    /// The rule's product with AVX-512 VNNI on 512-bit vectors (the 256-bit VNNI body for an
    /// unpaired last group): the same bits.
    matmul_rows(GroupQ8, QuantRows), [1, 2, 3, 4, 5, 6, 7, 8, 9],
    |op, out, g, r, R| pair_tile::<R>(op, out, g, r),
    vnni::tile::<simd::Avx512Vnni, R>(op, out, g, r)
);
