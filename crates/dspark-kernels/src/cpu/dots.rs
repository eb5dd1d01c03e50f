//! The Markov bias micro-kernel: for one column block `[d0, d0 + len)` and every request `b`,
//! `dst[b][i] = mult·(dst[b][i] + W2[d0 + i]·e_b)` (`dst` holds the base logits on entry).
//!
//! The AVX2+FMA version is register-blocked: [`ROWS`] rows of `W2` × up to [`REQS`] requests
//! share one pass over `r`, so each `W2` load feeds [`REQS`] FMAs and each `e` load feeds
//! [`ROWS`] (the `e` rows stay in L1), and `W2` is software-prefetched [`PREFETCH_ROWS`] rows
//! ahead (the FMAs between two rows leave too few loads in flight for the hardware prefetcher
//! to reach the memory bandwidth). A single request (a one-row decode, a redrawn slot) takes
//! [`WIDE`] rows per pass instead, its eight dots reduced together. Every dot product keeps the accumulation of
//! [`dots_portable`]: 8 lanes over the chunks of 8, the reduction
//! `((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7))`, then the tail in order, so the AVX2 and portable
//! (`Fused`) results are bit-identical.

use super::{MulAdd, Unfused, dots_portable};
use crate::view::{Floats, Mat};

/// Rows of `W2` per register tile.
const ROWS: usize = 2;
/// Requests per register tile (`ROWS·REQS` accumulators).
const REQS: usize = 4;
/// How far ahead `W2` is prefetched, in rows.
const PREFETCH_ROWS: usize = 4;
/// Rows of `W2` per tile of a single request ([`tile_wide`]).
const WIDE: usize = 8;

/// `dst[b][i] = mult·(dst[b][i] + W2[d0+i]·e_b)` for `b < dst.len()`, `i < dst[b].len()`.
///
/// `e` holds `dst.len()` vectors of `r = w2.dims[1]` values; every `dst[b]` has the same length
/// and `d0 + len <= w2.dims[0]` (callers validate shapes).
pub(crate) fn bias_block(w2: Mat<'_>, d0: usize, e: &[f32], dst: &mut [&mut [f32]], mult: f32) {
    #[cfg(target_arch = "x86_64")]
    if super::has_avx2() {
        // SAFETY: AVX2 and FMA are available (checked at run time).
        unsafe { bias_block_avx2(w2, d0, e, dst, mult) };
        return;
    }
    bias_block_portable::<Unfused>(w2, d0, e, dst, mult);
}

/// Row `d` of `w2` as f32: borrowed for f32 data, else widened into `buf`.
#[inline(always)]
fn row_f32<'a>(w2: &Mat<'a>, d: usize, buf: &'a mut [f32]) -> &'a [f32] {
    let r = w2.dims[1];
    match w2.data {
        Floats::F32(s) => &s[d * r..(d + 1) * r],
        other => {
            other.read_into(d * r, buf);
            buf
        }
    }
}

/// `*z = mult·(*z + dot)`.
#[inline(always)]
fn finish(z: &mut f32, dot: f32, mult: f32) {
    *z = mult * (*z + dot);
}

/// Portable [`bias_block`] (fixed-width lanes, `M`'s multiply-add).
pub(crate) fn bias_block_portable<M: MulAdd>(
    w2: Mat<'_>,
    d0: usize,
    e: &[f32],
    dst: &mut [&mut [f32]],
    mult: f32,
) {
    let r = w2.dims[1];
    let len = dst.first().map_or(0, |d| d.len());
    let mut wbuf = vec![0f32; r];
    for i in 0..len {
        let w = row_f32(&w2, d0 + i, &mut wbuf);
        for (b, z) in dst.iter_mut().enumerate() {
            let mut out = [0f32; 1];
            dots_portable::<M, 1>(w, &e[b * r..(b + 1) * r], &mut out);
            finish(&mut z[i], out[0], mult);
        }
    }
}

/// AVX2+FMA [`bias_block`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn bias_block_avx2(
    w2: Mat<'_>,
    d0: usize,
    e: &[f32],
    dst: &mut [&mut [f32]],
    mult: f32,
) {
    let r = w2.dims[1];
    let batch = dst.len();
    let len = dst.first().map_or(0, |d| d.len());
    // Bounds checks up front (they panic like slice indexing), so the tiles may read unchecked.
    let e = &e[..batch * r];
    if len > 0 {
        let _ = w2.row(d0 + len - 1);
    }
    let widen = !matches!(w2.data, Floats::F32(_));
    let mut i = 0;
    if batch == 1 {
        // One request: eight rows per pass, reduced together.
        let mut wbuf = vec![0f32; if widen { WIDE * r } else { 0 }];
        // No software prefetch: a pass reads `WIDE` consecutive rows, which the hardware
        // prefetcher follows (measured: prefetching them cost 10-25%).
        while i + WIDE <= len {
            let rows: &[f32] = match w2.data {
                Floats::F32(s) => &s[(d0 + i) * r..(d0 + i + WIDE) * r],
                other => {
                    other.read_into((d0 + i) * r, &mut wbuf);
                    &wbuf
                }
            };
            // SAFETY: AVX2+FMA are enabled here; `rows` holds `WIDE·r` values, `e` `r`, and
            // `i + WIDE <= len` bounds `dst[0]`.
            unsafe { tile_wide(rows, e, r, &mut dst[0][i..i + WIDE], mult) };
            i += WIDE;
        }
    }
    let mut wbuf = vec![0f32; if widen { ROWS * r } else { 0 }];
    while i < len {
        let nrows = (len - i).min(ROWS);
        prefetch_rows(&w2, d0 + i + PREFETCH_ROWS, nrows);
        let (wa, wb): (&[f32], &[f32]) = match w2.data {
            Floats::F32(s) => {
                let at = (d0 + i) * r;
                (&s[at..at + r], &s[at + (nrows - 1) * r..at + nrows * r])
            }
            other => {
                other.read_into((d0 + i) * r, &mut wbuf[..nrows * r]);
                let (a, b) = wbuf.split_at(r);
                (a, if nrows > 1 { b } else { a })
            }
        };
        let mut b = 0;
        while b < batch {
            let eb = &e[b * r..batch * r];
            let n = batch - b;
            // SAFETY (all arms): AVX2+FMA are enabled here; `wa`/`wb` hold `r` values and
            // `eb` holds at least `n·r >= N·r`.
            let used = unsafe {
                match (nrows, n) {
                    (2, n) if n >= REQS => tile::<2, REQS>([wa, wb], eb, r, dst, b, i, mult),
                    (2, 3) => tile::<2, 3>([wa, wb], eb, r, dst, b, i, mult),
                    (2, 2) => tile::<2, 2>([wa, wb], eb, r, dst, b, i, mult),
                    (2, _) => tile::<2, 1>([wa, wb], eb, r, dst, b, i, mult),
                    (_, n) if n >= REQS => tile::<1, REQS>([wa], eb, r, dst, b, i, mult),
                    (_, 3) => tile::<1, 3>([wa], eb, r, dst, b, i, mult),
                    (_, 2) => tile::<1, 2>([wa], eb, r, dst, b, i, mult),
                    _ => tile::<1, 1>([wa], eb, r, dst, b, i, mult),
                }
            };
            b += used;
        }
        i += nrows;
    }
}

/// Prefetch rows `[d, d + n)` of `w2` (those that exist) into L1.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_rows(w2: &Mat<'_>, d: usize, n: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let (rows, r) = (w2.dims[0], w2.dims[1]);
    if d >= rows {
        return;
    }
    let n = n.min(rows - d);
    let (ptr, bytes) = match w2.data {
        Floats::F32(s) => (s.as_ptr().cast::<i8>(), 4),
        Floats::F16(s) => (s.as_ptr().cast::<i8>(), 2),
        Floats::BF16(s) => (s.as_ptr().cast::<i8>(), 2),
    };
    let (start, end) = (d * r * bytes, (d + n) * r * bytes);
    let mut at = start;
    while at < end {
        // SAFETY: prefetching is a hint that never faults; `at < end <= rows·r·bytes` keeps the
        // address inside the matrix.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.add(at)) };
        at += 64;
    }
}

/// `R` rows × `N` requests (`b..b+N`) of column `i`: dots, then [`finish`]. Returns `N`.
///
/// # Safety
/// AVX2+FMA must be available; every `w[j]` holds `r` values and `e.len() >= N·r`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const N: usize>(
    w: [&[f32]; R],
    e: &[f32],
    r: usize,
    dst: &mut [&mut [f32]],
    b: usize,
    i: usize,
    mult: f32,
) -> usize {
    use std::arch::x86_64::{_mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps};
    debug_assert!(e.len() >= N * r && w.iter().all(|x| x.len() >= r));
    let full = r / 8 * 8;
    // acc[q][j]: request `b + q`, row `j`.
    let mut acc = [[_mm256_setzero_ps(); R]; N];
    let mut c = 0;
    while c < full {
        // SAFETY: `c + 8 <= full <= r` bounds every `w[j]`; `q·r + c + 8 <= N·r <= e.len()`.
        unsafe {
            let mut wv = [_mm256_setzero_ps(); R];
            for (v, row) in wv.iter_mut().zip(&w) {
                *v = _mm256_loadu_ps(row.as_ptr().add(c));
            }
            for (q, aq) in acc.iter_mut().enumerate() {
                let ev = _mm256_loadu_ps(e.as_ptr().add(q * r + c));
                for (a, wj) in aq.iter_mut().zip(&wv) {
                    *a = _mm256_fmadd_ps(*wj, ev, *a);
                }
            }
        }
        c += 8;
    }
    for (q, aq) in acc.iter().enumerate() {
        let eq = &e[q * r..(q + 1) * r];
        for (j, (a, row)) in aq.iter().zip(&w).enumerate() {
            let mut t = hsum(*a);
            for (x, y) in row[full..r].iter().zip(&eq[full..]) {
                t = x.mul_add(*y, t);
            }
            finish(&mut dst[b + q][i + j], t, mult);
        }
    }
    N
}

/// [`WIDE`] rows × one request: `out[j] = mult·(out[j] + rows[j]·e)`, the eight dots reduced
/// together in [`hsum`]'s order (one transpose of sums per eight rows in place of eight
/// horizontal sums), then each tail in order: bit-identical to [`tile`].
///
/// # Safety
/// AVX2+FMA must be available; `rows` holds `WIDE·r` values, `e` at least `r`, `out` `WIDE`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_wide(rows: &[f32], e: &[f32], r: usize, out: &mut [f32], mult: f32) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_fmadd_ps, _mm256_hadd_ps, _mm256_loadu_ps, _mm256_permute2f128_ps,
        _mm256_setzero_ps, _mm256_storeu_ps,
    };
    debug_assert!(rows.len() >= WIDE * r && e.len() >= r && out.len() >= WIDE);
    let full = r / 8 * 8;
    let mut acc = [_mm256_setzero_ps(); WIDE];
    let mut c = 0;
    while c < full {
        // SAFETY: `c + 8 <= full <= r` bounds `e` and every row `j·r + c + 8 <= WIDE·r`.
        unsafe {
            let ev = _mm256_loadu_ps(e.as_ptr().add(c));
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(rows.as_ptr().add(j * r + c)), ev, *a);
            }
        }
        c += 8;
    }
    // [s_j | s_k] with s_j = lo(a_j) + hi(a_j), as `hsum` first adds.
    let pair = |j: usize, k: usize| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(acc[j], acc[k]),
            _mm256_permute2f128_ps::<0x31>(acc[j], acc[k]),
        )
    };
    let h0 = _mm256_hadd_ps(pair(0, 1), pair(2, 3));
    let h1 = _mm256_hadd_ps(pair(4, 5), pair(6, 7));
    // Lanes: rows 0, 2, 4, 6, 1, 3, 5, 7, each `(s0+s1)+(s2+s3)`.
    let mut sums = [0f32; WIDE];
    // SAFETY: `sums` holds 8 values.
    unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), _mm256_hadd_ps(h0, h1)) };
    for (lane, &j) in [0usize, 2, 4, 6, 1, 3, 5, 7].iter().enumerate() {
        let mut t = sums[lane];
        let row = &rows[j * r..(j + 1) * r];
        for (x, y) in row[full..].iter().zip(&e[full..r]) {
            t = x.mul_add(*y, t);
        }
        finish(&mut out[j], t, mult);
    }
}

/// `((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7))`, the reduction of [`dots_portable`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::{
        _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_hadd_ps, _mm_movehdup_ps,
        _mm256_castps256_ps128, _mm256_extractf128_ps,
    };
    // s = [a0+a4, a1+a5, a2+a6, a3+a7]
    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    // h = [s0+s1, s2+s3, ..]
    let h = _mm_hadd_ps(s, s);
    _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Fused;
    use half::{bf16, f16};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        crate::test_values::grid(n, seed, 20_011, 20_011.0, 0.5)
    }

    /// Run `f` on `dst` rows initialised to `base` and return them flattened.
    fn run(base: &[f32], batch: usize, len: usize, f: impl FnOnce(&mut [&mut [f32]])) -> Vec<f32> {
        let mut out = base.to_vec();
        let mut rows: Vec<&mut [f32]> = out.chunks_mut(len).take(batch).collect();
        f(&mut rows);
        out
    }

    #[test]
    fn portable_matches_a_direct_computation() {
        let (v, r, batch, d0, len) = (40, 13, 3, 5, 30);
        let w = values(v * r, 1);
        let e = values(batch * r, 2);
        let base = values(batch * len, 3);
        let m = Mat::new(Floats::F32(&w), [v, r]).unwrap();
        let got = run(&base, batch, len, |d| {
            bias_block_portable::<Unfused>(m, d0, &e, d, 1.5)
        });
        for b in 0..batch {
            for i in 0..len {
                let dot: f64 = (0..r)
                    .map(|c| f64::from(w[(d0 + i) * r + c]) * f64::from(e[b * r + c]))
                    .sum();
                let want = 1.5 * (f64::from(base[b * len + i]) + dot);
                let g = f64::from(got[b * len + i]);
                assert!((g - want).abs() < 1e-5, "b {b} i {i}: {g} vs {want}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_is_bit_identical_to_portable_fused() {
        if !super::super::has_avx2() {
            return;
        }
        // r: multiple of 8, not, below 8; len: odd, even, 1; batch 1, 3, 8, 9.
        for &(v, r) in &[(300usize, 256usize), (77, 37), (9, 5), (64, 8), (41, 16)] {
            let w = values(v * r, 7);
            let bf: Vec<bf16> = w.iter().map(|&x| bf16::from_f32(x)).collect();
            let hf: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
            for batch in [1usize, 2, 3, 8, 9] {
                let e = values(batch * r, 11);
                for &(d0, len) in &[(0usize, v), (1, v - 1), (v - 1, 1), (2, (v - 2).min(255))] {
                    let base = values(batch * len, 13);
                    for data in [Floats::F32(&w), Floats::BF16(&bf), Floats::F16(&hf)] {
                        let m = Mat::new(data, [v, r]).unwrap();
                        // SAFETY: AVX2+FMA checked above.
                        let fast = run(&base, batch, len, |d| unsafe {
                            bias_block_avx2(m, d0, &e, d, 0.75)
                        });
                        let slow = run(&base, batch, len, |d| {
                            bias_block_portable::<Fused>(m, d0, &e, d, 0.75)
                        });
                        let same = fast
                            .iter()
                            .zip(&slow)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "v {v} r {r} batch {batch} d0 {d0} len {len}");
                        let dispatched = run(&base, batch, len, |d| bias_block(m, d0, &e, d, 0.75));
                        assert_eq!(dispatched, fast);
                    }
                }
            }
        }
    }
}
