//! The VNNI body of the Q8_0 product (AVX-512 VNNI or AVX-VNNI, one body for both): the rule
//! of `rule.rs` over one group of 8 outputs at a time. A group-block's 8 words (word `k`: bytes
//! `4k .. 4k + 4` of the 8 rows) are offset by 128 once (`w + 128`, unsigned), and each
//! activation row's 4 bytes (broadcast) give one `vpdpbusd`: lane `j` gains row `j`'s 4
//! products. The sum starts at `−128 · Σx` (the row's block sum, kept beside its bytes), so after
//! the 8 words lane `j` is row `j`'s exact block sum `Σ w · x`; it is widened, scaled and added
//! with one fused multiply-add, as the rule says.

use std::arch::x86_64::*;

use super::acts::QuantRows;
use super::rule::{BLOCK, GroupQ8};
use super::simd::{self, Dpbusd, Operands, broadcast4, group_body, prefetch_step, store};

/// Group `g`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs from `o0`).
///
/// # Safety
/// `D`'s extension, AVX2, FMA and F16C must be available and enabled by the caller; `weight`
/// holds group `g`'s `blocks` blocks and `x` rows `r .. r + R`.
#[inline(always)]
pub(crate) unsafe fn tile<D: Dpbusd, const R: usize>(
    op: &Operands<'_, GroupQ8, QuantRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let w = op.group(g);
    let rows: [(&[f32], &[i8], &[i32]); R] = std::array::from_fn(|t| op.x.row(r + t));
    // SAFETY (every intrinsic below): the caller enables AVX2, FMA, F16C and `D`'s extension.
    unsafe {
        let flip = _mm256_set1_epi8(-128);
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, block) in w.iter().enumerate() {
            let mut sums: [__m256i; R] =
                std::array::from_fn(|t| _mm256_set1_epi32(-128 * rows[t].2[b]));
            for k in 0..BLOCK / 4 {
                prefetch_step(block, k, BLOCK / 4);
                // Word `k` is bytes 32k .. 32k + 32 of the group-block's 256.
                let word = _mm256_loadu_si256(block.qs.as_ptr().add(32 * k).cast());
                let word = _mm256_xor_si256(word, flip);
                for (sum, (_, xq, _)) in sums.iter_mut().zip(&rows) {
                    // Bytes 4k .. 4k + 4 of the row's block `b`.
                    let xb = broadcast4(xq.as_ptr().add(b * BLOCK + 4 * k));
                    *sum = D::dpbusd(*sum, word, xb);
                }
            }
            // The 8 f16 scales are 16 readable bytes.
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(block.d.as_ptr().cast()));
            for (t, (xd, _, _)) in rows.iter().enumerate() {
                // `d_w · d_x` rounded once, per output.
                let s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[b]));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), s, acc[t]);
            }
        }
        store::<_, 8, R, _, _>(&acc, op, (g, r), out);
    }
}

group_body!(
    /// The rule's product with AVX-VNNI: the same bits.
    matmul_rows_avxvnni(GroupQ8, QuantRows), "avx2,fma,f16c,avxvnni", [1, 2, 3, 4],
    |op, out, g, r, R| tile::<simd::AvxVnni, R>(op, out, g, r)
);
