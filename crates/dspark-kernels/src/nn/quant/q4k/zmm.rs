//! The AVX-512 body of the Q4_K product: the VNNI body (`vnni.rs`) on 512-bit vectors, two
//! groups side by side (lanes 0–7: group `g`'s rows, 8–15: group `g + 1`'s), as the Q8_0 one
//! (`quant/zmm.rs`) pairs them. Both groups' scales are unpacked by the AVX2 code and joined;
//! each nibble word pair and activation row's 4 bytes give one `vpdpbusd` for 16 outputs. A
//! call's last group, when it has no pair, runs the 256-bit VNNI body.

use std::arch::x86_64::*;

use super::rule::{GroupQ4K, Q8KRows, SUB, SUPER};
use super::vnni;
use super::x86::{MINS16, SCALE32, unpack8};
use crate::nn::quant::simd::{self, Operands, pair_body, store};
use crate::nn::quant::zmm::{pair_f16, pair_word};

/// Two 256-bit halves as one vector (`lo`: lanes 0–7).
#[inline(always)]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    // SAFETY: AVX-512 F is enabled wherever this is inlined (the 512-bit body).
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// `word`'s bytes as the 32-byte control `table` picks them, per 128-bit lane.
#[inline(always)]
fn shuffle(word: __m512i, table: &[i8; 32]) -> __m512i {
    // SAFETY: 32 readable bytes; AVX-512 F and BW are enabled wherever this is inlined.
    unsafe {
        let ctl = _mm512_broadcast_i64x4(_mm256_loadu_si256(table.as_ptr().cast()));
        _mm512_shuffle_epi8(word, ctl)
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
    op: &Operands<'_, GroupQ4K, Q8KRows>,
    out: &mut [f32],
    g: usize,
    r: usize,
) {
    let (w0, w1) = (op.group(g), op.group(g + 1));
    let rows: [(&[f32], &[i8], &[i16]); R] = std::array::from_fn(|t| op.x.row(r + t));
    // SAFETY (every intrinsic and helper below): the caller enables the extensions; the loads
    // stay within the group super-blocks and the rows' blocks.
    unsafe {
        let low = _mm512_set1_epi8(15);
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); R];
        for (b, (b0, b1)) in w0.iter().zip(w1).enumerate() {
            let ahead = op.pair_ahead(g, b);
            let [sc_lo, sc_hi, m_lo, m_hi] = {
                let (u0, u1) = (unpack8(b0), unpack8(b1));
                std::array::from_fn::<_, 4, _>(|i| join(u0[i], u1[i]))
            };
            let xs: [*const i8; R] =
                std::array::from_fn(|t| rows[t].1[b * SUPER..][..SUPER].as_ptr());
            let mut isum = [zero; R];
            for c in 0..SUPER / 64 {
                let (mut lo, mut hi) = ([zero; R], [zero; R]);
                for k in 0..SUB / 4 {
                    ahead.step(8 * c + k, SUPER / 8);
                    let v = pair_word(&b0.qs, &b1.qs, 8 * c + k);
                    let vl = _mm512_and_si512(v, low);
                    let vh = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                    for t in 0..R {
                        let xq = xs[t].add(64 * c + 4 * k);
                        let xl = _mm512_set1_epi32(xq.cast::<i32>().read_unaligned());
                        let xh = _mm512_set1_epi32(xq.add(SUB).cast::<i32>().read_unaligned());
                        lo[t] = _mm512_dpbusd_epi32(lo[t], vl, xl);
                        hi[t] = _mm512_dpbusd_epi32(hi[t], vh, xh);
                    }
                }
                // Lane j: its row's scales of sub-blocks 2c and 2c + 1, as i32.
                let word = if c < 2 { sc_lo } else { sc_hi };
                let s_lo = shuffle(word, &SCALE32[2 * c % 4]);
                let s_hi = shuffle(word, &SCALE32[2 * c % 4 + 1]);
                for t in 0..R {
                    let both = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo[t], s_lo),
                        _mm512_mullo_epi32(hi[t], s_hi),
                    );
                    isum[t] = _mm512_add_epi32(isum[t], both);
                }
            }
            let (dw, mw) = (pair_f16(&b0.d, &b1.d), pair_f16(&b0.dmin, &b1.dmin));
            for (t, (xd, _, xs)) in rows.iter().enumerate() {
                // The mins' sums: the rows' (min, min) pairs against the row's bsum pairs.
                let mut msum = zero;
                for p in 0..4 {
                    let m = shuffle(if p < 2 { m_lo } else { m_hi }, &MINS16[p % 2]);
                    let pair = xs[b * 8 + 2 * p..].as_ptr().cast::<i32>().read_unaligned();
                    msum = _mm512_add_epi32(msum, _mm512_madd_epi16(m, _mm512_set1_epi32(pair)));
                }
                // `fma(isum, d · d_x)` then `fma(−msum, dmin · d_x)`, as the rule says.
                let xdb = _mm512_set1_ps(xd[b]);
                let a =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, xdb), acc[t]);
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(mw, xdb), a);
            }
        }
        store::<_, 16, R, _, _>(&acc, op, (g, r), out);
    }
}

pair_body!(
    /// The rule's product with AVX-512 VNNI on 512-bit vectors (the 256-bit VNNI body for an
    /// unpaired last group): the same bits.
    matmul_rows(GroupQ4K, Q8KRows), [1, 2, 3, 4, 5, 6, 7, 8],
    |op, out, g, r, R| pair_tile::<R>(op, out, g, r),
    vnni::tile::<simd::Avx512Vnni, R>(op, out, g, r)
);
