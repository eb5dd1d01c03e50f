//! The AVX2 body of the Q8_0 product: the rule of `rule.rs` over one group of 8 outputs at a
//! time. A group-block's bytes are 8 words of 32 bytes, word `k` holding bytes `4k .. 4k + 4`
//! of the 8 rows; per word, `|w|` is taken once, and each activation row's 4 bytes (broadcast)
//! give `vpmaddwd(vpmaddubsw(|w|, x · sign(w)), 1)`: lane `j` gains row `j`'s 4 products (exact:
//! `|w| ≤ 128` and `|x| ≤ 127` keep each pair within an i16). After the 8 words, lane `j` is
//! row `j`'s block sum; it is widened, scaled by the group's 8 scales (widened in one F16C
//! instruction) and added with one fused multiply-add. A tile covers up to 4 activation rows,
//! so a group-block is read from memory once for all of them.

use std::arch::x86_64::*;

use super::acts::QuantRows;
use super::rule::{BLOCK, GroupQ8};
use super::simd::{Operands, broadcast4, group_body, prefetch_step, store};

/// Group `g`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs from `o0`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `weight` holds group `g`'s `blocks` blocks and `x`
/// rows `r .. r + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const R: usize>(
    op: &Operands<'_, GroupQ8, QuantRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let w = op.group(g);
    let rows: [(&[f32], &[i8], &[i32]); R] = std::array::from_fn(|t| op.x.row(r + t));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, block) in w.iter().enumerate() {
        let mut sums = [_mm256_setzero_si256(); R];
        for k in 0..BLOCK / 4 {
            prefetch_step(block, k, BLOCK / 4);
            // SAFETY: word `k` is bytes 32k .. 32k + 32 of the group-block's 256.
            let word = unsafe { _mm256_loadu_si256(block.qs.as_ptr().add(32 * k).cast()) };
            let mag = _mm256_abs_epi8(word);
            for (sum, (_, xq, _)) in sums.iter_mut().zip(&rows) {
                // SAFETY: bytes 4k .. 4k + 4 of the row's block `b`.
                let xb = unsafe { broadcast4(xq.as_ptr().add(b * BLOCK + 4 * k)) };
                let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xb, word));
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, ones));
            }
        }
        // SAFETY: the 8 f16 scales are 16 readable bytes.
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(block.d.as_ptr().cast()) });
        for (t, (xd, _, _)) in rows.iter().enumerate() {
            // `d_w · d_x` rounded once, per output.
            let s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[b]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), s, acc[t]);
        }
    }
    store::<_, 8, R, _, _>(&acc, op, (g, r), out);
}

group_body!(
    /// The rule's product with AVX2, FMA and F16C: the same bits.
    matmul_rows(GroupQ8, QuantRows), "avx2,fma,f16c", [1, 2, 3, 4],
    |op, out, g, r, R| tile::<R>(op, out, g, r)
);
