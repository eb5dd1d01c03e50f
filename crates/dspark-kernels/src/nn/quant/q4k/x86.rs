//! The AVX2 body of the Q4_K product: the rule of `rule.rs` over one group of 8 outputs at a
//! time, and the scale unpacking the VNNI body shares.
//!
//! Per group super-block, the 8 rows' packed scales (3 interleaved words) are unpacked together
//! ([`unpack8`]); its nibbles are 32 words, word `8c + k` holding bytes `32c + 4k ..` of every
//! row, whose low nibbles are sub-block `2c`'s levels and high nibbles sub-block `2c + 1`'s. Per
//! word and activation row, `vpmaddubsw(levels, x)` (4 bytes of `x` broadcast) adds two products
//! per i16 to lane `j` (row `j`); a sub-block's 8 words stay within an i16 (`8 · 2 · 15 · 127`),
//! and `vpmaddwd` with the rows' sub-block scales widens and scales them at once. The mins'
//! sums are 4 `vpmaddwd` of the rows' (min, min) pairs against the row's (bsum, bsum) pairs.
//! Lane `j` ends as row `j`'s exact `isum` and `msum`, which two fused multiply-adds scale as
//! the rule says. A tile covers up to 3 activation rows (AVX2's 16 registers hold their 9 sums).

use std::arch::x86_64::*;

use super::rule::{GroupQ4K, Q8KRows, SUB, SUPER};
use crate::nn::quant::simd::{Operands, broadcast4, group_body, prefetch_step, store};

/// A `vpshufb` control that gives every 32-bit lane the bytes `bytes` of itself (`-1`: zero).
const fn pick(bytes: [i8; 4]) -> [i8; 32] {
    let mut out = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        let b = bytes[i % 4];
        out[i] = if b < 0 {
            -128
        } else {
            b + 4 * ((i % 16) / 4) as i8
        };
        i += 1;
    }
    out
}

/// Lane `j` of an unpacked scale word to row `j`'s byte `s` (a sub-block's scale) as an i32.
pub(crate) static SCALE32: [[i8; 32]; 4] = [
    pick([0, -1, -1, -1]),
    pick([1, -1, -1, -1]),
    pick([2, -1, -1, -1]),
    pick([3, -1, -1, -1]),
];

/// Lane `j` of an unpacked scale word to row `j`'s byte `s`, twice, as two i16.
static SCALE16: [[i8; 32]; 4] = [
    pick([0, -1, 0, -1]),
    pick([1, -1, 1, -1]),
    pick([2, -1, 2, -1]),
    pick([3, -1, 3, -1]),
];

/// Lane `j` of an unpacked min word to row `j`'s bytes `2p` and `2p + 1`, as two i16.
pub(crate) static MINS16: [[i8; 32]; 2] = [pick([0, -1, 1, -1]), pick([2, -1, 3, -1])];

/// `word`'s bytes as the control `table` picks them.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn shuffle(word: __m256i, table: &[i8; 32]) -> __m256i {
    // SAFETY: the control is 32 readable bytes.
    _mm256_shuffle_epi8(word, unsafe { _mm256_loadu_si256(table.as_ptr().cast()) })
}

/// The 8 rows' scales and mins, lane `j` row `j`'s: `(scales 0-3, scales 4-7, mins 0-3, mins
/// 4-7)`, one byte each ([`super::rule::unpack`] on 8 rows at once).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn unpack8(block: &GroupQ4K) -> [__m256i; 4] {
    // SAFETY: the scales are 96 readable bytes: words 0, 1 and 2 of the 8 rows.
    let [a, b, c] =
        [0, 1, 2].map(|w| unsafe { _mm256_loadu_si256(block.scales.as_ptr().add(32 * w).cast()) });
    let low6 = _mm256_set1_epi8(0x3f);
    let low4 = _mm256_set1_epi8(0x0f);
    let low2 = _mm256_set1_epi8(0x03);
    let top2 =
        |v: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(v), low2));
    [
        _mm256_and_si256(a, low6),
        _mm256_or_si256(_mm256_and_si256(c, low4), top2(a)),
        _mm256_and_si256(b, low6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(c), low4), top2(b)),
    ]
}

/// Row `t`'s `msum` per lane: the rows' mins against its 8 sub-block sums `bsums`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn min_sums(mins: [__m256i; 2], bsums: &[i16]) -> __m256i {
    let mut msum = _mm256_setzero_si256();
    for p in 0..4 {
        // Lane j: row j's mins 2p and 2p + 1 as two i16; the row's bsums 2p and 2p + 1 likewise.
        let m = shuffle(mins[p / 2], &MINS16[p % 2]);
        // SAFETY: bsums 2p, 2p + 1 are 4 readable bytes.
        let s = unsafe { broadcast4(bsums[2 * p..].as_ptr().cast()) };
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m, s));
    }
    msum
}

/// Add a super-block's `isum` and `msum` (lane `j`: row `j`'s) to `acc` as the rule does:
/// `fma(isum, d · d_x)` then `fma(−msum, dmin · d_x)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scale_add(
    block: &GroupQ4K,
    xd: f32,
    isum: __m256i,
    msum: __m256i,
    acc: __m256,
) -> __m256 {
    // SAFETY: the 8 f16 factors are 16 readable bytes each.
    let (dw, mw) = unsafe {
        (
            _mm256_cvtph_ps(_mm_loadu_si128(block.d.as_ptr().cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(block.dmin.as_ptr().cast())),
        )
    };
    let xdb = _mm256_set1_ps(xd);
    let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, xdb), acc);
    _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(mw, xdb), acc)
}

/// Group `g`'s outputs of rows `r .. r + R` into `out` (`[n, width]`, outputs from `o0`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `weight` holds group `g`'s `blocks` super-blocks and
/// `x` rows `r .. r + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const R: usize>(
    op: &Operands<'_, GroupQ4K, Q8KRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let w = op.group(g);
    let rows: [(&[f32], &[i8], &[i16]); R] = std::array::from_fn(|t| op.x.row(r + t));
    let low = _mm256_set1_epi8(15);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); R];
    for (b, block) in w.iter().enumerate() {
        let [sc_lo, sc_hi, m_lo, m_hi] = unpack8(block);
        // Row t's 256 bytes of this block.
        let xs: [*const i8; R] = std::array::from_fn(|t| rows[t].1[b * SUPER..][..SUPER].as_ptr());
        let mut isum = [zero; R];
        for c in 0..SUPER / 64 {
            let (mut lo, mut hi) = ([zero; R], [zero; R]);
            for k in 0..SUB / 4 {
                prefetch_step(block, 8 * c + k, SUPER / 8);
                // SAFETY: word 8c + k is bytes 32 (8c + k) .. + 32 of the 1,024.
                let v =
                    unsafe { _mm256_loadu_si256(block.qs.as_ptr().add(32 * (8 * c + k)).cast()) };
                let (vl, vh) = (
                    _mm256_and_si256(v, low),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                );
                for t in 0..R {
                    // SAFETY: bytes 64c + 4k and 64c + 32 + 4k (4 each) of the row's 256.
                    let (xl, xh) = unsafe {
                        (
                            broadcast4(xs[t].add(64 * c + 4 * k)),
                            broadcast4(xs[t].add(64 * c + SUB + 4 * k)),
                        )
                    };
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(vl, xl));
                    hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(vh, xh));
                }
            }
            // Lane j: row j's scales of sub-blocks 2c and 2c + 1, each twice as i16.
            let word = if c < 2 { sc_lo } else { sc_hi };
            let s_lo = shuffle(word, &SCALE16[2 * c % 4]);
            let s_hi = shuffle(word, &SCALE16[2 * c % 4 + 1]);
            for t in 0..R {
                let both = _mm256_add_epi32(
                    _mm256_madd_epi16(lo[t], s_lo),
                    _mm256_madd_epi16(hi[t], s_hi),
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

group_body!(
    /// The rule's product with AVX2, FMA and F16C: the same bits.
    matmul_rows(GroupQ4K, Q8KRows), "avx2,fma,f16c", [1, 2, 3],
    |op, out, g, r, R| tile::<R>(op, out, g, r)
);
