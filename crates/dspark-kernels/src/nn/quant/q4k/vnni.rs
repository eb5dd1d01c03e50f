//! The VNNI body of the Q4_K product (AVX-512 VNNI or AVX-VNNI, one body for both): the AVX2
//! body's walk (`x86.rs`), with one `vpdpbusd` per nibble word and activation row in place of
//! `vpmaddubsw` and an add. A sub-block's 8 words leave lane `j` with row `j`'s exact sub-block
//! dot product in 32 bits, which `vpmulld` scales by the row's sub-block scale.

use std::arch::x86_64::*;

use super::rule::{GroupQ4K, Q8KRows, SUB, SUPER};
use super::x86::{SCALE32, min_sums, scale_add, shuffle, unpack8};
use crate::nn::quant::simd::{
    self, Dpbusd, Operands, broadcast4, group_body, prefetch_step, store,
};

/// Group `g`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs from `o0`).
///
/// # Safety
/// `D`'s extension, AVX2, FMA and F16C must be available and enabled by the caller; `weight`
/// holds group `g`'s `blocks` super-blocks and `x` rows `r .. r + R`.
#[inline(always)]
pub(crate) unsafe fn tile<D: Dpbusd, const R: usize>(
    op: &Operands<'_, GroupQ4K, Q8KRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let w = op.group(g);
    let rows: [(&[f32], &[i8], &[i16]); R] = std::array::from_fn(|t| op.x.row(r + t));
    // SAFETY (every intrinsic and helper below): the caller enables AVX2, FMA, F16C and `D`'s
    // extension; the loads stay within the group super-block and the rows' blocks.
    unsafe {
        let low = _mm256_set1_epi8(15);
        let zero = _mm256_setzero_si256();
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, block) in w.iter().enumerate() {
            let [sc_lo, sc_hi, m_lo, m_hi] = unpack8(block);
            // Row t's 256 bytes of this block.
            let xs: [*const i8; R] =
                std::array::from_fn(|t| rows[t].1[b * SUPER..][..SUPER].as_ptr());
            let mut isum = [zero; R];
            for c in 0..SUPER / 64 {
                let (mut lo, mut hi) = ([zero; R], [zero; R]);
                for k in 0..SUB / 4 {
                    prefetch_step(block, 8 * c + k, SUPER / 8);
                    let v = _mm256_loadu_si256(block.qs.as_ptr().add(32 * (8 * c + k)).cast());
                    let vl = _mm256_and_si256(v, low);
                    let vh = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    for t in 0..R {
                        let xq = xs[t].add(64 * c + 4 * k);
                        lo[t] = D::dpbusd(lo[t], vl, broadcast4(xq));
                        hi[t] = D::dpbusd(hi[t], vh, broadcast4(xq.add(SUB)));
                    }
                }
                // Lane j: row j's scales of sub-blocks 2c and 2c + 1, as i32.
                let word = if c < 2 { sc_lo } else { sc_hi };
                let s_lo = shuffle(word, &SCALE32[2 * c % 4]);
                let s_hi = shuffle(word, &SCALE32[2 * c % 4 + 1]);
                for t in 0..R {
                    let both = _mm256_add_epi32(
                        _mm256_mullo_epi32(lo[t], s_lo),
                        _mm256_mullo_epi32(hi[t], s_hi),
                    );
                    isum[t] = _mm256_add_epi32(isum[t], both);
                }
            }
            for (t, (xd, _, xs)) in rows.iter().enumerate() {
                let msum = min_sums([m_lo, m_hi], &xs[b * 8..(b + 1) * 8]);
                acc[t] = scale_add(block, xd[b], isum[t], msum, acc[t]);
            }
        }
        store::<_, 8, R, _, _>(&acc, op, (g, r), out);
    }
}

group_body!(
    /// The rule's product with AVX-VNNI: the same bits.
    matmul_rows_avxvnni(GroupQ4K, Q8KRows), "avx2,fma,f16c,avxvnni", [1, 2, 3],
    |op, out, g, r, R| tile::<simd::AvxVnni, R>(op, out, g, r)
);
