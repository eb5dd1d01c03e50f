//! The AVX-512 and AVX2 register tiles of [`super::PanelView`], for every panel element type:
//! each 16-lane column is loaded and widened to f32 ([`PanelElem::load16`] /
//! [`PanelElem::load8`], exact), then fed to the same FMAs as f32 panels.

use std::arch::x86_64::*;

use super::dst::Dst;
use super::{PANEL, PanelElem};

/// How far ahead (bytes, in each panel stream) the tiles prefetch their weights.
///
/// The hardware prefetchers alone fell behind the tiles on a Xeon: the more FMAs a column feeds
/// (more rows), the fewer loads a core keeps in flight, and 2-byte panels take two widening
/// instructions per half line. Measured there (AVX-512, DRAM-sized ring of the memory-bound
/// pair's MLP matrices, 2 threads, interleaved in one run), without → with one prefetch per
/// cache line 2 KiB ahead: f32 1 row 23.3 → 24.0 GB/s, 9 rows 15.1 → 19.7 (a verification of
/// K = 8), 48 rows (a prefill chunk) +20%; bf16 one row 16.1 → 18.2–18.9 GiB/s; the AVX2 tile
/// run on the same CPU, f32 1 / 6 / 9 rows +19 / +40 / +25%, bf16 one row +30%. Flat from 2 to
/// 4 KiB. A prefetch changes no value. Which cache level it fills is [`TO_L2`] / [`TO_L1`].
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// The AVX-512 tiles prefetch into L2 (`prefetcht1`), where the hardware's L2 streamer puts a
/// stream, and leave the last step to L1 to the core's own prefetcher.
///
/// A study of the tiles' inner loops (none / `prefetcht0` / `prefetcht1`, 2 KiB ahead, a
/// 512 MiB ring, 9 interleaved repeats, paired medians against none) on two CPUs:
/// - a Xeon with AVX512-BF16 and AMX (the H200 machine's host), 2 threads: `t1` kept every gain
///   of `t0` (f32 1 / 9 rows 1.08 / 1.19 against 0.99 / 1.24; bf16 `vdpbf16ps` 1 row 1.12
///   against 0.99);
/// - this project's AMD EPYC (Zen 4): `t0` lost 12-13% on a bf16 row (`vdpbf16ps` and widened:
///   0.88 / 0.87), `t1` held 0.96-0.97 (the hardware's own pace). End to end, bf16 target-only
///   on the memory-bound pair went from 23.5 to 30.5 tokens/s (medians of 6 interleaved
///   processes), and f32 from 12.6 to 17.0.
pub(super) const TO_L2: i32 = _MM_HINT_T1;

/// The AVX2 tile prefetches into L1 (`prefetcht0`): in the same study, run on both CPUs, `t1`
/// lost 6 rows on the EPYC (0.71-0.81 of none, where `t0` held 0.98) and won nothing on the Xeon
/// (6 rows 1.54 against 1.62).
pub(super) const TO_L1: i32 = _MM_HINT_T0;

/// Prefetch into `HINT`'s cache the line [`PREFETCH_AHEAD`] bytes past `at` (a hint: it never
/// faults, so `at` may lie past the panel's end).
#[inline(always)]
pub(super) fn prefetch_ahead<const HINT: i32>(at: *const i8) {
    // SAFETY: a prefetch reads nothing architecturally and never faults.
    unsafe { _mm_prefetch::<HINT>(at.wrapping_add(PREFETCH_AHEAD)) };
}

/// Columns of a panel stream per cache line (at least 1): the tiles prefetch once per line.
#[inline(always)]
fn columns_per_line<T>(cs: usize) -> usize {
    (64 / (cs * std::mem::size_of::<T>()).max(1)).max(1)
}

/// `M` rows × `R` panels with AVX-512F.
///
/// # Safety
/// AVX-512F must be available; `w` holds panel `r`'s column `k` at `r·ps + k·cs` for
/// `r < R`, `k < cols` (16 lanes each), `xs` the `M` rows interleaved (`xs[k·M + q]`, `M·cols`
/// values); `dst` is writable for `M` rows × `R` panels (see [`Dst`]).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile512<T: PanelElem, const M: usize, const R: usize>(
    w: &[T],
    cols: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    dst: Dst,
) {
    debug_assert!(w.len() >= (R - 1) * ps + (cols - 1) * cs + PANEL);
    debug_assert!(xs.len() >= M * cols);
    let (wp, xp) = (w.as_ptr(), xs.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); R]; M];
    // Prefetch once per cache line of each panel stream, counted down (no division in the loop).
    let per_line = columns_per_line::<T>(cs);
    let mut until_line = 0;
    for k in 0..cols {
        if until_line == 0 {
            until_line = per_line;
            for r in 0..R {
                prefetch_ahead::<TO_L2>(wp.wrapping_add(r * ps + k * cs).cast());
            }
        }
        until_line -= 1;
        // SAFETY: `r·ps + k·cs + PANEL <= w.len()` and `k·M + q < M·cols`.
        unsafe {
            let mut wv = [_mm512_setzero_ps(); R];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = T::load16(wp.add(r * ps + k * cs));
            }
            for (q, aq) in acc.iter_mut().enumerate() {
                let xb = _mm512_set1_ps(*xp.add(k * M + q));
                for (a, v) in aq.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(*v, xb, *a);
                }
            }
        }
    }
    // SAFETY: by the caller's contract.
    unsafe { put512(&acc, dst) };
}

/// `M` rows × 1 panel (two 8-lane halves) with AVX2 + FMA (+ F16C for `f16`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds column `k` at `k·cs` (16 lanes each) for
/// `k < cols`, `xs` the `M` rows interleaved (`xs[k·M + q]`, `M·cols` values); `dst` is
/// writable for `M` rows × 1 panel (see [`Dst`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile256<T: PanelElem, const M: usize>(
    w: &[T],
    cols: usize,
    (_, cs): (usize, usize),
    xs: &[f32],
    dst: Dst,
) {
    debug_assert!(w.len() >= (cols - 1) * cs + PANEL && xs.len() >= M * cols);
    let (wp, xp) = (w.as_ptr(), xs.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    let per_line = columns_per_line::<T>(cs);
    let mut until_line = 0;
    for k in 0..cols {
        if until_line == 0 {
            until_line = per_line;
            prefetch_ahead::<TO_L1>(wp.wrapping_add(k * cs).cast());
        }
        until_line -= 1;
        // SAFETY: `k·cs + PANEL <= w.len()` and `k·M + q < M·cols`.
        unsafe {
            let lo = T::load8(wp.add(k * cs));
            let hi = T::load8(wp.add(k * cs + 8));
            for (q, aq) in acc.iter_mut().enumerate() {
                let xb = _mm256_set1_ps(*xp.add(k * M + q));
                aq[0] = _mm256_fmadd_ps(lo, xb, aq[0]);
                aq[1] = _mm256_fmadd_ps(hi, xb, aq[1]);
            }
        }
    }
    // SAFETY: by the caller's contract.
    unsafe { put256(&acc, 0, 1, dst) };
}

/// Write `M × R` accumulators to `dst`.
///
/// # Safety
/// AVX-512F must be available; `dst` writable for `M` rows × `R` panels.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn put512<const M: usize, const R: usize>(acc: &[[__m512; R]; M], dst: Dst) {
    let mut lanes = [0f32; PANEL];
    for (q, aq) in acc.iter().enumerate() {
        for (r, a) in aq.iter().enumerate() {
            // SAFETY: `lanes` holds 16 values; `dst` by the caller's contract.
            unsafe {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
                dst.put(q, r, R, &lanes);
            }
        }
    }
}

/// Write row `q`'s two halves of panel `r` (of `np`) for `M` rows.
///
/// # Safety
/// AVX2 must be available; `dst` writable for those rows and panel.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn put256<const M: usize>(acc: &[[__m256; 2]; M], r: usize, np: usize, dst: Dst) {
    let mut lanes = [0f32; PANEL];
    for (q, aq) in acc.iter().enumerate() {
        // SAFETY: `lanes` holds 16 values; `dst` by the caller's contract.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), aq[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), aq[1]);
            dst.put(q, r, np, &lanes);
        }
    }
}
