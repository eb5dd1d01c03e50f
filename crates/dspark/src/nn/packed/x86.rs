//! The AVX-512 and AVX2 register tiles of [`super::PanelView`], for every panel element type:
//! each 16-lane column is loaded and widened to f32 ([`PanelElem::load16`] /
//! [`PanelElem::load8`], exact), then fed to the same FMAs as f32 panels.

use std::arch::x86_64::*;

use super::tile::Dst;
use super::{PANEL, PanelElem};

/// How far ahead (bytes, per panel stream) the AVX-512 tile prefetches 2-byte panels.
///
/// A one-row bf16 product streamed at 0.6–0.8 of the read floor on a Xeon (criterion
/// `decode_matvec/bfloat16/1`, a DRAM-sized ring, 2 threads: 16.1 GiB/s median against
/// 20 GiB/s for f32 and 18 GiB/s for a plain read): each column of a 2-byte panel is half a
/// cache line and takes two widening instructions, so the loads a core keeps in flight span
/// half the bytes an f32 tile's do, and the hardware prefetchers fall behind. One prefetch per
/// line, 1 KiB ahead in each panel: 18.2–18.9 GiB/s, interleaved in one run. f32 panels keep
/// none (one row measured 12–15% slower with it).
const PREFETCH_2BYTE: usize = 1024;

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
    // Columns per cache line of a panel stream: prefetch once per line (2-byte panels only),
    // counted down (no division in the loop).
    let elem = std::mem::size_of::<T>();
    let per_line = if elem == 2 {
        (64 / (cs * elem).max(1)).max(1)
    } else {
        0
    };
    let mut until_line = 0;
    for k in 0..cols {
        if per_line != 0 {
            if until_line == 0 {
                until_line = per_line;
                for r in 0..R {
                    // A prefetch never faults: the address may lie past the panel's end.
                    let at = wp.wrapping_add(r * ps + k * cs).cast::<i8>();
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_2BYTE));
                }
            }
            until_line -= 1;
        }
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
    for k in 0..cols {
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
    let mut lanes = [0f32; PANEL];
    for (q, aq) in acc.iter().enumerate() {
        // SAFETY: `lanes` holds 16 values; `dst` by the caller's contract.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), aq[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), aq[1]);
            dst.put(q, 0, 1, &lanes);
        }
    }
}
