//! The AVX2 body of the Q8_0 product: the rule of `rule.rs` over one group of 8 outputs at a
//! time. Per activation row and block, `|x|` is taken once; each of the group's rows gives its
//! 32-byte integer dot product with `vpmaddubsw(|x|, w · sign(x))` and `vpmaddwd`; the 8 sums
//! are reduced into one vector (one lane per output, exact integer adds), widened, scaled by
//! the group's 8 scales (widened in one F16C instruction) and added with one fused
//! multiply-add. A tile covers up to [`ROWS`] activation rows, so a group-block is read from
//! memory once for all of them.

use std::arch::x86_64::*;

use super::rule::{BLOCK, GROUP, GroupQ8, QuantRows};

/// Activation rows per tile at most.
const ROWS: usize = 4;

/// How far ahead (bytes) of the block being read the kernels prefetch the weight stream.
const PREFETCH_AHEAD: usize = 2048;

/// Prefetch into L1 every cache line of the `bytes` that start [`PREFETCH_AHEAD`] bytes past
/// `at` (a hint: it never faults, so the span may lie past the weights' end). The weights are
/// one forward stream, group after group; the hardware prefetchers alone fell behind it.
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(at: *const T, bytes: usize) {
    let at = at.cast::<i8>().wrapping_add(PREFETCH_AHEAD);
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line)) };
    }
}

/// The 8 exact integer dot products of a group-block's rows with one activation block
/// (`ax = |x|`, `xv = x`), as one vector: lane `j` is row `j`'s.
#[inline]
#[target_feature(enable = "avx2")]
fn group_dots(block: &GroupQ8, ax: __m256i, xv: __m256i) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let dot = |j: usize| {
        // SAFETY: a row's 32 bytes are readable.
        let w = unsafe { _mm256_loadu_si256(block.qs[j].as_ptr().cast()) };
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xv)), ones)
    };
    let h01 = _mm256_hadd_epi32(dot(0), dot(1));
    let h23 = _mm256_hadd_epi32(dot(2), dot(3));
    let h45 = _mm256_hadd_epi32(dot(4), dot(5));
    let h67 = _mm256_hadd_epi32(dot(6), dot(7));
    // Per 128-bit half: rows 0-3 (then 4-7), each the sum of that half's 4 lanes.
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
/// AVX2, FMA and F16C must be available; `weight` holds group `g`'s `blocks` blocks and `x`
/// rows `r .. r + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const R: usize>(
    weight: &[GroupQ8],
    blocks: usize,
    x: &QuantRows,
    (g, r): (usize, usize),
    o0: usize,
    width: usize,
    out: &mut [f32],
) {
    let w = &weight[g * blocks..(g + 1) * blocks];
    let rows: [(&[f32], &[i8]); R] = std::array::from_fn(|t| x.row(r + t));
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, block) in w.iter().enumerate() {
        prefetch_ahead(block, std::mem::size_of::<GroupQ8>());
        // SAFETY: the 8 f16 scales are 16 readable bytes.
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(block.d.as_ptr().cast()) });
        for (t, (xd, xq)) in rows.iter().enumerate() {
            let q = &xq[b * BLOCK..(b + 1) * BLOCK];
            // SAFETY: `q` is 32 readable bytes.
            let xv = unsafe { _mm256_loadu_si256(q.as_ptr().cast()) };
            let sums = group_dots(block, _mm256_sign_epi8(xv, xv), xv);
            // `d_w · d_x` rounded once, per output.
            let s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[b]));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), s, acc[t]);
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
    weight: &[GroupQ8],
    blocks: usize,
    x: &QuantRows,
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
                    _ => tile::<ROWS>(weight, blocks, x, at, o0, width, out),
                }
            }
            r += ROWS.min(n - r);
        }
    }
}
