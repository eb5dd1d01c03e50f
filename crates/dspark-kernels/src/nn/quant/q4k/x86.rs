//! The AVX2 body of the Q4_K product: the rule of `rule.rs` over one group of 8 outputs at a
//! time. Per group super-block, the 8 rows' scales and mins are unpacked once for every
//! activation row. For each weight row, its 128 bytes of nibbles are split once into 8
//! sub-blocks of 32 levels; each activation row then gives `vpmaddubsw(levels, x)` (exact: at
//! most 2 · 15 · 128 in size) and `vpmaddwd` with the sub-block's scale, summed over the
//! sub-blocks. The 8 rows' sums (and their `m · bsum` sums) are reduced into one vector, one
//! lane per output (exact integer adds), widened and added with two fused multiply-adds. A tile
//! covers up to [`ROWS`] activation rows, so a group super-block is read from memory once for
//! all of them.

use std::arch::x86_64::*;

use super::rule::{GroupQ4K, Q8KRows, SUB, SUBS, SUPER, unpack};
use crate::nn::quant::rule::GROUP;
use crate::nn::quant::x86::prefetch_ahead;

/// Activation rows per tile at most: a verification's 9 (K = 8) in one pass over the weights.
/// A tile keeps one integer sum per row in a register beside the two nibble vectors and their
/// two scale vectors, 13 of AVX2's 16.
const ROWS: usize = 9;

/// Lane `j` of the result: the sum of the 8 lanes of `v[j]` (exact integer adds).
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8(v: &[__m256i; GROUP]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    let lo = _mm256_hadd_epi32(h01, h23);
    let hi = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// Group `g`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs from `o0`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `weight` holds group `g`'s `blocks` super-blocks and
/// `x` rows `r .. r + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const R: usize>(
    weight: &[GroupQ4K],
    blocks: usize,
    x: &Q8KRows,
    (g, r): (usize, usize),
    o0: usize,
    width: usize,
    out: &mut [f32],
) {
    let w = &weight[g * blocks..(g + 1) * blocks];
    let mut rows = [(&[][..], &[][..], &[][..]); R];
    for (t, row) in rows.iter_mut().enumerate() {
        *row = x.row(r + t);
    }
    let low = _mm256_set1_epi8(15);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, block) in w.iter().enumerate() {
        prefetch_ahead(block, std::mem::size_of::<GroupQ4K>());
        // Row t's 256 activation bytes of this block.
        let mut xs = [std::ptr::null::<i8>(); R];
        for (p, (_, xq, _)) in xs.iter_mut().zip(&rows) {
            *p = xq[b * SUPER..(b + 1) * SUPER].as_ptr();
        }
        let mut mins = [0u8; GROUP * SUBS];
        let mut dots = [[zero; GROUP]; R];
        for j in 0..GROUP {
            let (sc, m) = unpack(&block.scales[j]);
            mins[j * SUBS..(j + 1) * SUBS].copy_from_slice(&m);
            // The 8 scales in every 8 bytes; `vpshufb` with (s, 0x80) pairs spreads scale s
            // over 16 i16 lanes.
            let scales = _mm256_set1_epi64x(i64::from_le_bytes(sc));
            let qs = block.qs[j].as_ptr();
            let mut sums = [zero; R];
            for c in 0..SUBS / 2 {
                // SAFETY: bytes 32c .. 32c + 32 of the row's 128.
                let raw = unsafe { _mm256_loadu_si256(qs.add(c * SUB).cast()) };
                let even = _mm256_and_si256(raw, low);
                let odd = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
                let s0 = (2 * c) as i16;
                let sc0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(s0 | -0x8000));
                let sc1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((s0 + 1) | -0x8000));
                for (sum, &q) in sums.iter_mut().zip(&xs) {
                    // SAFETY: sub-blocks 2c and 2c + 1 are bytes 64c .. 64c + 64 of the 256.
                    let (x0, x1) = unsafe {
                        (
                            _mm256_loadu_si256(q.add(2 * c * SUB).cast()),
                            _mm256_loadu_si256(q.add((2 * c + 1) * SUB).cast()),
                        )
                    };
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(even, x0), sc0);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(odd, x1), sc1);
                    *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(p0, p1));
                }
            }
            for (d, &sum) in dots.iter_mut().zip(&sums) {
                d[j] = sum;
            }
        }
        // Rows 2p and 2p + 1's mins, widened to i16.
        let mut mv = [zero; GROUP / 2];
        for (p, v) in mv.iter_mut().enumerate() {
            // SAFETY: bytes 16p .. 16p + 16 of the 64.
            *v = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(mins.as_ptr().add(16 * p).cast()) });
        }
        // SAFETY: the 8 f16 factors are 16 readable bytes each.
        let (dw, mw) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(block.d.as_ptr().cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(block.dmin.as_ptr().cast())),
            )
        };
        for (t, (xd, _, xsum)) in rows.iter().enumerate() {
            // SAFETY: the block's 8 sub-block sums are 16 readable bytes.
            let bs = unsafe { _mm_loadu_si128(xsum[b * SUBS..(b + 1) * SUBS].as_ptr().cast()) };
            let bs = _mm256_broadcastsi128_si256(bs);
            // Lanes 0-3 of each product are row 2p's, 4-7 row 2p + 1's; per 128-bit half, the
            // three adds leave rows 0, 2, 4, 6 (low) and 1, 3, 5, 7 (high), interleaved back.
            let h = _mm256_hadd_epi32(
                _mm256_hadd_epi32(_mm256_madd_epi16(mv[0], bs), _mm256_madd_epi16(mv[1], bs)),
                _mm256_hadd_epi32(_mm256_madd_epi16(mv[2], bs), _mm256_madd_epi16(mv[3], bs)),
            );
            let msum = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            let isum = _mm256_cvtepi32_ps(reduce8(&dots[t]));
            let msum = _mm256_cvtepi32_ps(msum);
            let xdb = _mm256_set1_ps(xd[b]);
            acc[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, xdb), acc[t]);
            acc[t] = _mm256_fnmadd_ps(msum, _mm256_mul_ps(mw, xdb), acc[t]);
        }
    }
    let first = g * GROUP - o0;
    let take = GROUP.min(width - first);
    for (t, a) in acc.iter().enumerate() {
        let mut lanes = [0.0f32; GROUP];
        // SAFETY: `lanes` is 8 writable floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
        out[(r + t) * width + first..][..take].copy_from_slice(&lanes[..take]);
    }
}

/// [`super::rule::matmul_rows`] with AVX2, FMA and F16C: the same bits.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `o0` is a multiple of [`GROUP`], `weight` holds the
/// groups of outputs `o0 .. o0 + out.len() / n` (`blocks` each) and `x` `n` rows of `blocks`
/// blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows(
    weight: &[GroupQ4K],
    blocks: usize,
    x: &Q8KRows,
    n: usize,
    o0: usize,
    out: &mut [f32],
) {
    let width = out.len() / n.max(1);
    for g in o0 / GROUP..(o0 + width).div_ceil(GROUP) {
        let mut r = 0;
        while r < n {
            let at = (g, r);
            // SAFETY: by this function's contract, for the rows each call covers.
            unsafe {
                match n - r {
                    1 => tile::<1>(weight, blocks, x, at, o0, width, out),
                    2 => tile::<2>(weight, blocks, x, at, o0, width, out),
                    3 => tile::<3>(weight, blocks, x, at, o0, width, out),
                    4 => tile::<4>(weight, blocks, x, at, o0, width, out),
                    5 => tile::<5>(weight, blocks, x, at, o0, width, out),
                    6 => tile::<6>(weight, blocks, x, at, o0, width, out),
                    7 => tile::<7>(weight, blocks, x, at, o0, width, out),
                    8 => tile::<8>(weight, blocks, x, at, o0, width, out),
                    _ => tile::<ROWS>(weight, blocks, x, at, o0, width, out),
                }
            }
            r += ROWS.min(n - r);
        }
    }
}
