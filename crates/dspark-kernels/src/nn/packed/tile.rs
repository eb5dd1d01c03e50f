//! The register tiles' dispatch: which tile shape each kernel runs, where the sums go, and the
//! portable tile (the x86 bodies are in `x86.rs`).

use std::borrow::Cow;

use half::bf16;

use super::dst::{Dst, row_tiles};
use super::{Kernel, PANEL, PanelElem, TILE_ROWS, pairs};

/// Panels per AVX-512 register tile: up to 6 rows × 4 panels, 9 rows × 3 panels or 12 rows ×
/// 2 panels (24 to 27 accumulators of the 32 registers).
const PANELS_512: usize = 4;

/// `(panels per group, rows per tile at most)` of `kernel` for `n` input rows. A product of up
/// to 12 rows (a verification of `K ≤ 11`) is one tile, so each weight line is read once,
/// straight into the FMAs that use it.
///
/// 7 to 9 rows (a verification of `K = 8`, the drafter's block) take 3 panels, not 2: one
/// more weight stream in flight per tile, which measured faster on the memory-bound pair than
/// 2 panels or two 6-row tiles of 4 panels (`cargo bench --bench packed` compares them).
///
/// AMX (bf16 panels only, see [`Kernel::for_elem`]) runs 16 rows × 4 panels, or 32 rows × 2
/// panels past 16 rows (a prefill's row tiles then share each group's weights from L2).
pub(super) fn tiling(kernel: Kernel, n: usize) -> (usize, usize) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx if n <= 16 => (4, 16),
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx => (2, super::amx::MAX_ROWS),
        Kernel::Avx512 | Kernel::Avx512Bf16 if n <= 6 => (PANELS_512, 6),
        Kernel::Avx512 | Kernel::Avx512Bf16 if n <= 9 => (3, 9),
        Kernel::Avx512 | Kernel::Avx512Bf16 => (2, TILE_ROWS),
        Kernel::Avx2 | Kernel::Portable => (1, 6),
        #[cfg(not(target_arch = "x86_64"))]
        Kernel::Amx => (1, 6),
    }
}

/// `m` rows × `np` panels `w` into `dst` (its `ptr` at the tile's first row and the group's
/// first panel). `xs` holds the tile's rows interleaved by column ([`interleave`]): row `q`,
/// column `k` at `xs[k·m + q]`, so each column's `m` inputs are one short run of memory.
/// Dispatches to a monomorphized kernel.
///
/// # Safety
/// `dst` as in `PanelView::panels_into` for `m` rows and `np` panels.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile<T: PanelElem>(
    kernel: Kernel,
    w: &[T],
    np: usize,
    cols: usize,
    strides: (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
) {
    debug_assert!((m <= TILE_ROWS || kernel == Kernel::Amx) && np >= 1);
    if let Some(w) = as_pairs(w) {
        // SAFETY: by the caller's contract.
        return unsafe { pairs::tile(kernel, w, np, cols, strides, xs, m, dst) };
    }
    debug_assert!(w.len() == (np - 1) * strides.0 + (cols - 1) * strides.1 + PANEL);
    debug_assert!(xs.len() == m * cols);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 | Kernel::Avx512Bf16 | Kernel::Amx => {
            use super::x86::tile512;
            macro_rules! go {
                ($($m:literal),*) => {
                    match (m, np) {
                        $(
                            ($m, 4) => tile512::<T, $m, 4>(w, cols, strides, xs, dst),
                            ($m, 3) => tile512::<T, $m, 3>(w, cols, strides, xs, dst),
                            ($m, 2) => tile512::<T, $m, 2>(w, cols, strides, xs, dst),
                            ($m, _) => tile512::<T, $m, 1>(w, cols, strides, xs, dst),
                        )*
                        _ => {}
                    }
                };
            }
            macro_rules! go_3 {
                ($($m:literal),*) => {
                    match m {
                        $($m => tile512::<T, $m, 3>(w, cols, strides, xs, dst),)*
                        _ => {}
                    }
                };
            }
            macro_rules! go_wide {
                ($($m:literal),*) => {
                    match (m, np) {
                        $(
                            ($m, 2) => tile512::<T, $m, 2>(w, cols, strides, xs, dst),
                            ($m, _) => tile512::<T, $m, 1>(w, cols, strides, xs, dst),
                        )*
                        _ => {}
                    }
                };
            }
            // SAFETY: `Kernel::Avx512` is only chosen when the CPU supports AVX-512F; the
            // shapes are the ones asserted above, `dst` by the caller's contract.
            unsafe {
                if m <= 6 {
                    go!(1, 2, 3, 4, 5, 6)
                } else if np == 3 {
                    go_3!(7, 8, 9)
                } else {
                    go_wide!(7, 8, 9, 10, 11, 12)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            use super::x86::tile256;
            // SAFETY: `Kernel::Avx2` is only chosen when the CPU supports AVX2, FMA and F16C;
            // `dst` by the caller's contract.
            unsafe {
                match m {
                    1 => tile256::<T, 1>(w, cols, strides, xs, dst),
                    2 => tile256::<T, 2>(w, cols, strides, xs, dst),
                    3 => tile256::<T, 3>(w, cols, strides, xs, dst),
                    4 => tile256::<T, 4>(w, cols, strides, xs, dst),
                    5 => tile256::<T, 5>(w, cols, strides, xs, dst),
                    _ => tile256::<T, 6>(w, cols, strides, xs, dst),
                }
            }
        }
        _ => {
            // SAFETY: by the caller's contract.
            unsafe { tile_portable(w, np, cols, strides, xs, m, dst) }
        }
    }
}

/// `w` as bf16 pair panels when `T` stores pairs (bf16, the only such type).
fn as_pairs<T: PanelElem>(w: &[T]) -> Option<&[bf16]> {
    (T::PAIR > 1 && T::DTYPE == crate::nn::WeightDtype::BF16).then(|| {
        // SAFETY: `PanelElem` is sealed and only `bf16` has the BF16 dtype, so `T` is `bf16`.
        unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<bf16>(), w.len()) }
    })
}

/// Input values per row of `cols` columns in the tiles' layout ([`inputs`]).
pub(super) fn input_width<T: PanelElem>(kernel: Kernel, cols: usize) -> usize {
    if T::PAIR > 1 {
        cols.div_ceil(2) * pairs::per_slot(kernel)
    } else {
        cols
    }
}

/// The tiles' inputs of row-major `x: [n, cols]` for `T` panels on `kernel`: each row tile
/// interleaved by column ([`interleave`]; one row as it is), or bf16's rounded pairs
/// ([`pairs::inputs`]).
pub(super) fn inputs<'a, T: PanelElem>(
    kernel: Kernel,
    x: &'a [f32],
    n: usize,
    cols: usize,
) -> Cow<'a, [f32]> {
    let max_rows = tiling(kernel, n).1;
    if T::PAIR > 1 {
        Cow::Owned(pairs::inputs(kernel, x, n, cols, max_rows))
    } else if n > 1 {
        Cow::Owned(interleave(x, n, cols, max_rows))
    } else {
        Cow::Borrowed(x)
    }
}

/// Plain-Rust tile (any `m`, `np`; `xs` interleaved as in [`tile`]): each weight widened
/// exactly, then `f32::mul_add`.
///
/// # Safety
/// `dst` as in [`tile`].
unsafe fn tile_portable<T: PanelElem>(
    w: &[T],
    np: usize,
    cols: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
) {
    let sums = |r: usize, q: usize| {
        let mut acc = [0f32; PANEL];
        for k in 0..cols {
            let xv = xs[k * m + q];
            let lanes = &w[r * ps + k * cs..r * ps + k * cs + PANEL];
            for (a, &wv) in acc.iter_mut().zip(lanes) {
                *a = wv.to_f32().mul_add(xv, *a);
            }
        }
        acc
    };
    // SAFETY: by the caller's contract.
    unsafe { dst.put_each(m, np, sums) };
}

/// Row-major `x: [n, cols]` with each row tile ([`row_tiles`]) interleaved by column: tile
/// `(i0, m)` occupies `[i0·cols, (i0 + m)·cols)` as before, holding row `i0 + q`, column `k` at
/// `i0·cols + k·m + q`. A tile then reads its `m` inputs of column `k` from one short run
/// instead of `m` rows `cols` apart (one stream, not `m`, beside the weights').
pub(super) fn interleave(x: &[f32], n: usize, cols: usize, max_rows: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (i0, m) in row_tiles(n, max_rows) {
        let tile = &mut out[i0 * cols..(i0 + m) * cols];
        for q in 0..m {
            let row = &x[(i0 + q) * cols..(i0 + q + 1) * cols];
            for (k, &v) in row.iter().enumerate() {
                tile[k * m + q] = v;
            }
        }
    }
    out
}
