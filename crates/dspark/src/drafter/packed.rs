//! Weights packed in column panels, for the CPU products of a decode or verify step.
//!
//! A speculative round multiplies a few rows (one token per request, or `K + 1` for a
//! verification) by every weight of the model. [`PackedMatrix`] stores `W: [out, in]` as
//! `⌈out / 16⌉` panels of `[in, 16]` (16 consecutive output rows interleaved, zero-padded), so
//! a register tile multiplies up to [`TILE_ROWS`] input rows by several panels at once: per
//! input column `k`, one vector load of each panel and one broadcast of each input row feed
//! `rows × panels` fused multiply-adds, and every output is a lane of an accumulator, with no
//! horizontal sum. The weight is read once per call (a panel group stays in L2 while the input
//! tiles pass over it), and the packed form replaces the `[out, in]` one: no extra memory.
//!
//! Every output accumulates `acc = fma(w[k], x[k], acc)` for `k` ascending from `0.0` (then
//! `+ bias`), so the AVX-512, AVX2 and portable kernels give the same bits on every machine.
//! Large products (prefill) split the panels over the thread pool under the policy of
//! [`crate::threads`].

use rayon::prelude::*;

use super::layers::PAR_MIN_MACS;

/// Output rows per panel (one AVX-512 vector, two AVX2 vectors).
pub const PANEL: usize = 16;

/// Input rows per register tile at most (`n` rows are split into balanced tiles).
pub const TILE_ROWS: usize = 12;

/// Panels per AVX-512 register tile: up to 6 rows × 4 panels or 12 rows × 2 panels (24
/// accumulators of the 32 registers).
const PANELS_512: usize = 4;

/// How many groups ahead the kernels prefetch.
const AHEAD: usize = 2;

/// `(panels per group, rows per tile at most)` of `kernel` for `n` input rows. A product of up
/// to 12 rows (a verification of `K ≤ 11`) is one tile, so each weight line is read once,
/// straight into the FMAs that use it.
fn tiling(kernel: Kernel, n: usize) -> (usize, usize) {
    match kernel {
        Kernel::Avx512 if n <= 6 => (PANELS_512, 6),
        Kernel::Avx512 => (2, TILE_ROWS),
        Kernel::Avx2 | Kernel::Portable => (1, 6),
    }
}

/// `W: [rows, cols]` in panel layout (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix {
    rows: usize,
    cols: usize,
    /// `⌈rows / PANEL⌉ · cols · PANEL` values: panel `p`, column `k`, lane `j` holds
    /// `W[p·PANEL + j, k]` (zero past `rows`).
    data: Vec<f32>,
}

/// Which kernel runs a product (all give the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512F: tiles of up to 6 rows × 4 panels.
    Avx512,
    /// AVX2 + FMA: tiles of up to 6 rows × 1 panel.
    Avx2,
    /// Plain Rust (`f32::mul_add`).
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::sampling::fastmath::has_avx512() {
                return Self::Avx512;
            }
            if crate::sampling::fastmath::has_avx2() {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Whether this CPU runs `self`.
    pub fn available(self) -> bool {
        match self {
            Self::Portable => true,
            Self::Avx2 => matches!(Self::best(), Self::Avx2 | Self::Avx512),
            Self::Avx512 => Self::best() == Self::Avx512,
        }
    }
}

impl PackedMatrix {
    /// Pack row-major `w: [rows, cols]`; `None` when `w.len() != rows · cols`.
    pub fn pack(w: &[f32], rows: usize, cols: usize) -> Option<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return None;
        }
        Some(Self::pack_strided(w, cols, rows, cols))
    }

    /// Pack the `[rows, cols]` matrix whose element `(o, k)` is `at(o, k)`.
    pub fn pack_with(rows: usize, cols: usize, at: impl Fn(usize, usize) -> f32) -> Self {
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0f32; panels * cols * PANEL];
        for (p, panel) in data.chunks_exact_mut((cols * PANEL).max(1)).enumerate() {
            for j in 0..PANEL.min(rows - p * PANEL) {
                let o = p * PANEL + j;
                for k in 0..cols {
                    panel[k * PANEL + j] = at(o, k);
                }
            }
        }
        Self { rows, cols, data }
    }

    /// Pack `W = Aᵀ` for `A: [cols, rows]` whose row `k` is `a[k · stride ..][..rows]`: panel `p`,
    /// column `k` is the 16 values `A[k][16p ..]`, one contiguous copy (attention's values,
    /// `Vᵀ`). Rows of `a` must lie inside it (callers check shapes).
    pub fn pack_transposed(a: &[f32], stride: usize, rows: usize, cols: usize) -> Self {
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0f32; panels * cols * PANEL];
        for (p, panel) in data.chunks_exact_mut((cols * PANEL).max(1)).enumerate() {
            let (d0, width) = (p * PANEL, PANEL.min(rows - p * PANEL));
            for (k, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
                let at = k * stride + d0;
                dst[..width].copy_from_slice(&a[at..at + width]);
            }
        }
        Self { rows, cols, data }
    }

    /// Pack `W: [rows, cols]` whose row `o` is `a[o · stride ..][..cols]` (a strided view).
    pub fn pack_strided(a: &[f32], stride: usize, rows: usize, cols: usize) -> Self {
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0f32; panels * cols * PANEL];
        for (p, panel) in data.chunks_exact_mut((cols * PANEL).max(1)).enumerate() {
            for j in 0..PANEL.min(rows - p * PANEL) {
                let at = (p * PANEL + j) * stride;
                for (k, &v) in a[at..at + cols].iter().enumerate() {
                    panel[k * PANEL + j] = v;
                }
            }
        }
        Self { rows, cols, data }
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`in`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The row-major `[rows, cols]` matrix back.
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.rows * self.cols];
        for (o, dst) in w.chunks_exact_mut(self.cols.max(1)).enumerate() {
            let (p, j) = (o / PANEL, o % PANEL);
            let panel = &self.data[p * self.cols * PANEL..];
            for (k, d) in dst.iter_mut().enumerate() {
                *d = panel[k * PANEL + j];
            }
        }
        w
    }

    /// `y = x · Wᵀ (+ bias)` for row-major `x: [n, cols]`, giving row-major `[n, rows]`, with
    /// the fastest kernel. `None` when `x.len() != n · cols` or `bias` is not `rows` long.
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        self.matmul_with(Kernel::best(), x, n, bias)
    }

    /// [`Self::matmul`] with a chosen kernel (the portable one when `kernel` is not
    /// [available](Kernel::available)).
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> Option<Vec<f32>> {
        self.view().matmul_with(kernel, x, n, bias)
    }

    /// The matrix as a [`PanelView`] (panels and columns contiguous).
    pub fn view(&self) -> PanelView<'_> {
        PanelView {
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
            panel_stride: self.cols * PANEL,
            col_stride: PANEL,
        }
    }
}

/// A borrowed `W: [rows, cols]` in panel layout at any strides: panel `p`, column `k`, lane `j`
/// (`W[p·PANEL + j, k]`) is `data[p · panel_stride + k · col_stride + j]`. Lanes past `rows` in
/// the last panel are read but their outputs are dropped, so they may hold anything finite or
/// not. A [`PackedMatrix`] is the contiguous case; a cache whose rows already sit in this
/// layout (attention's values `Vᵀ`: panel `p`, column `k` is key `k`'s dimensions `16p ..`) is
/// multiplied where it lies, with no packing, and gives the same bits as packing it first.
#[derive(Debug, Clone, Copy)]
pub struct PanelView<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    panel_stride: usize,
    col_stride: usize,
}

impl<'a> PanelView<'a> {
    /// The view, or `None` when a lane of some panel's column would lie outside `data`.
    pub fn new(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        panel_stride: usize,
        col_stride: usize,
    ) -> Option<Self> {
        if rows > 0 && cols > 0 {
            let last = (rows.div_ceil(PANEL) - 1)
                .checked_mul(panel_stride)?
                .checked_add((cols - 1).checked_mul(col_stride)?)?
                .checked_add(PANEL)?;
            if last > data.len() {
                return None;
            }
        }
        Some(Self {
            data,
            rows,
            cols,
            panel_stride,
            col_stride,
        })
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// `y = x · Wᵀ (+ bias)` as [`PackedMatrix::matmul`], with the fastest kernel.
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        self.matmul_with(Kernel::best(), x, n, bias)
    }

    /// [`Self::matmul`] with a chosen kernel (the portable one when `kernel` is not
    /// [available](Kernel::available)).
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> Option<Vec<f32>> {
        let kernel = if kernel.available() {
            kernel
        } else {
            Kernel::Portable
        };
        if n.checked_mul(self.cols) != Some(x.len()) || bias.is_some_and(|b| b.len() != self.rows) {
            return None;
        }
        let (rows, cols) = (self.rows, self.cols);
        if n == 0 || rows == 0 {
            return Some(vec![0f32; n * rows]);
        }
        let panels = rows.div_ceil(PANEL);
        // Panel-major result `[panel][n][PANEL]`: every task writes whole panels.
        let mut yp = vec![0f32; panels * n * PANEL];
        let work = n.saturating_mul(rows).saturating_mul(cols);
        if cols == 0 {
            // No inputs: every product is 0 (then + bias); no panel has a column to read.
        } else if panels > 1 && work >= PAR_MIN_MACS && crate::threads::use_pool(work) {
            let per = panels
                .div_ceil(rayon::current_num_threads() * 4)
                .next_multiple_of(PANELS_512);
            yp.par_chunks_mut(per * n * PANEL)
                .enumerate()
                .for_each(|(c, out)| self.panels_into(kernel, x, n, c * per, out));
        } else {
            self.panels_into(kernel, x, n, 0, &mut yp);
        }
        let mut y = vec![0f32; n * rows];
        for (p, block) in yp.chunks_exact(n * PANEL).enumerate() {
            let (o0, width) = (p * PANEL, PANEL.min(rows - p * PANEL));
            for (i, lanes) in block.chunks_exact(PANEL).enumerate() {
                let dst = &mut y[i * rows + o0..i * rows + o0 + width];
                match bias {
                    Some(b) => {
                        for ((d, &a), &b) in dst.iter_mut().zip(lanes).zip(&b[o0..o0 + width]) {
                            *d = a + b;
                        }
                    }
                    None => dst.copy_from_slice(&lanes[..width]),
                }
            }
        }
        Some(y)
    }

    /// The values of panels `p .. p + np` (from the first lane of the first to the last lane
    /// of the last column of the last).
    fn panels(&self, p: usize, np: usize) -> &'a [f32] {
        let start = p * self.panel_stride;
        let end = (p + np - 1) * self.panel_stride + (self.cols - 1) * self.col_stride + PANEL;
        &self.data[start..end]
    }

    /// Panels `p0 ..` (as many as `out` holds, `[panel][n][PANEL]`) of `x · Wᵀ`.
    fn panels_into(&self, kernel: Kernel, x: &[f32], n: usize, p0: usize, out: &mut [f32]) {
        let cols = self.cols;
        let strides = (self.panel_stride, self.col_stride);
        let contiguous = strides == (cols * PANEL, PANEL);
        let panels = self.rows.div_ceil(PANEL);
        let (group, max_rows) = tiling(kernel, n);
        for (g, block) in out.chunks_mut(group * n * PANEL).enumerate() {
            let p = p0 + g * group;
            let np = block.len() / (n * PANEL);
            let w = self.panels(p, np);
            // The first tile streams the group after next towards L1 as it goes (the hardware
            // prefetcher alone leaves the FMAs waiting on memory at 7–12 rows). Only for a
            // contiguous matrix, whose next group is one run of memory.
            let ahead_np = np.min(panels.saturating_sub(p + AHEAD * np));
            let next = if contiguous && ahead_np > 0 {
                self.panels(p + AHEAD * np, ahead_np)
            } else {
                &[]
            };
            let tiles = n.div_ceil(max_rows);
            let mut i0 = 0;
            for t in 0..tiles {
                let m = n / tiles + usize::from(t < n % tiles);
                let xs = &x[i0 * cols..(i0 + m) * cols];
                let ahead = if t == 0 { next } else { &[] };
                tile(kernel, w, np, cols, strides, xs, m, block, n, i0, ahead);
                i0 += m;
            }
        }
    }
}

/// `m` rows `xs` × `np` panels `w` into `out[r][i0 + q][..]` (`out` holds `np` panels of `n`
/// rows), prefetching `ahead` (the next panels, or nothing) on the way. Dispatches to a
/// monomorphized kernel.
#[allow(clippy::too_many_arguments)]
fn tile(
    kernel: Kernel,
    w: &[f32],
    np: usize,
    cols: usize,
    strides: (usize, usize),
    xs: &[f32],
    m: usize,
    out: &mut [f32],
    n: usize,
    i0: usize,
    ahead: &[f32],
) {
    debug_assert!(w.len() == (np - 1) * strides.0 + (cols - 1) * strides.1 + PANEL);
    debug_assert!(xs.len() == m * cols);
    debug_assert!(out.len() == np * n * PANEL && i0 + m <= n && m <= TILE_ROWS);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => {
            macro_rules! go {
                ($($m:literal),*) => {
                    match (m, np) {
                        $(
                            ($m, 4) => x86::tile512::<$m, 4>(w, cols, strides, xs, out, n, i0, ahead),
                            ($m, 3) => x86::tile512::<$m, 3>(w, cols, strides, xs, out, n, i0, ahead),
                            ($m, 2) => x86::tile512::<$m, 2>(w, cols, strides, xs, out, n, i0, ahead),
                            ($m, _) => x86::tile512::<$m, 1>(w, cols, strides, xs, out, n, i0, ahead),
                        )*
                        _ => {}
                    }
                };
            }
            macro_rules! go_wide {
                ($($m:literal),*) => {
                    match (m, np) {
                        $(
                            ($m, 2) => x86::tile512::<$m, 2>(w, cols, strides, xs, out, n, i0, ahead),
                            ($m, _) => x86::tile512::<$m, 1>(w, cols, strides, xs, out, n, i0, ahead),
                        )*
                        _ => {}
                    }
                };
            }
            // SAFETY: `Kernel::Avx512` is only chosen when the CPU supports AVX-512F; the
            // shapes are the ones asserted above.
            unsafe {
                if m <= 6 {
                    go!(1, 2, 3, 4, 5, 6)
                } else {
                    go_wide!(7, 8, 9, 10, 11, 12)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            // SAFETY: `Kernel::Avx2` is only chosen when the CPU supports AVX2 and FMA.
            unsafe {
                match m {
                    1 => x86::tile256::<1>(w, cols, strides, xs, out, n, i0, ahead),
                    2 => x86::tile256::<2>(w, cols, strides, xs, out, n, i0, ahead),
                    3 => x86::tile256::<3>(w, cols, strides, xs, out, n, i0, ahead),
                    4 => x86::tile256::<4>(w, cols, strides, xs, out, n, i0, ahead),
                    5 => x86::tile256::<5>(w, cols, strides, xs, out, n, i0, ahead),
                    _ => x86::tile256::<6>(w, cols, strides, xs, out, n, i0, ahead),
                }
            }
        }
        _ => {
            let _ = ahead;
            tile_portable(w, np, cols, strides, xs, m, out, n, i0)
        }
    }
}

/// Plain-Rust tile (any `m`, `np`).
#[allow(clippy::too_many_arguments)]
fn tile_portable(
    w: &[f32],
    np: usize,
    cols: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    m: usize,
    out: &mut [f32],
    n: usize,
    i0: usize,
) {
    for r in 0..np {
        for q in 0..m {
            let x = &xs[q * cols..(q + 1) * cols];
            let mut acc = [0f32; PANEL];
            for (k, &xv) in x.iter().enumerate() {
                let lanes = &w[r * ps + k * cs..r * ps + k * cs + PANEL];
                for (a, &wv) in acc.iter_mut().zip(lanes) {
                    *a = wv.mul_add(xv, *a);
                }
            }
            let at = (r * n + i0 + q) * PANEL;
            out[at..at + PANEL].copy_from_slice(&acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PANEL;
    use std::arch::x86_64::*;

    /// `M` rows × `R` panels with AVX-512F.
    ///
    /// # Safety
    /// AVX-512F must be available; `w` holds panel `r`'s column `k` at `r·ps + k·cs` for
    /// `r < R`, `k < cols` (16 lanes each), `xs` `M·cols`, `out` `R·n·PANEL` with
    /// `i0 + M <= n`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile512<const M: usize, const R: usize>(
        w: &[f32],
        cols: usize,
        (ps, cs): (usize, usize),
        xs: &[f32],
        out: &mut [f32],
        n: usize,
        i0: usize,
        ahead: &[f32],
    ) {
        debug_assert!(w.len() >= (R - 1) * ps + (cols - 1) * cs + PANEL);
        debug_assert!(xs.len() >= M * cols);
        debug_assert!(out.len() >= R * n * PANEL && i0 + M <= n);
        let (wp, xp, op) = (w.as_ptr(), xs.as_ptr(), out.as_mut_ptr());
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        // One cache line of `ahead` per panel line read: the next group arrives as this ends.
        let (ap, lines) = (ahead.as_ptr(), ahead.len() / PANEL);
        for k in 0..cols {
            for l in 0..R {
                let line = k * R + l;
                if line < lines {
                    // SAFETY: a prefetch never faults, and `line·PANEL < ahead.len()`.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(ap.add(line * PANEL).cast()) };
                }
            }
            // SAFETY: `r·ps + k·cs + PANEL <= w.len()` and `q·cols + k < M·cols`.
            unsafe {
                let mut wv = [_mm512_setzero_ps(); R];
                for (r, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(wp.add(r * ps + k * cs));
                }
                for (q, aq) in acc.iter_mut().enumerate() {
                    let xb = _mm512_set1_ps(*xp.add(q * cols + k));
                    for (a, v) in aq.iter_mut().zip(&wv) {
                        *a = _mm512_fmadd_ps(*v, xb, *a);
                    }
                }
            }
        }
        for (q, aq) in acc.iter().enumerate() {
            for (r, a) in aq.iter().enumerate() {
                // SAFETY: `(r·n + i0 + q)·PANEL + PANEL <= R·n·PANEL`.
                unsafe { _mm512_storeu_ps(op.add((r * n + i0 + q) * PANEL), *a) };
            }
        }
    }

    /// `M` rows × 1 panel (two 8-lane halves) with AVX2 + FMA.
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `w` holds column `k` at `k·cs` (16 lanes each) for
    /// `k < cols`, `xs` `M·cols`, `out` `n·PANEL` with `i0 + M <= n`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile256<const M: usize>(
        w: &[f32],
        cols: usize,
        (_, cs): (usize, usize),
        xs: &[f32],
        out: &mut [f32],
        n: usize,
        i0: usize,
        ahead: &[f32],
    ) {
        debug_assert!(w.len() >= (cols - 1) * cs + PANEL && xs.len() >= M * cols);
        debug_assert!(out.len() >= n * PANEL && i0 + M <= n);
        let (wp, xp, op) = (w.as_ptr(), xs.as_ptr(), out.as_mut_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; M];
        let (ap, lines) = (ahead.as_ptr(), ahead.len() / PANEL);
        for k in 0..cols {
            if k < lines {
                // SAFETY: a prefetch never faults, and `k·PANEL < ahead.len()`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ap.add(k * PANEL).cast()) };
            }
            // SAFETY: `k·cs + PANEL <= w.len()` and `q·cols + k < M·cols`.
            unsafe {
                let lo = _mm256_loadu_ps(wp.add(k * cs));
                let hi = _mm256_loadu_ps(wp.add(k * cs + 8));
                for (q, aq) in acc.iter_mut().enumerate() {
                    let xb = _mm256_set1_ps(*xp.add(q * cols + k));
                    aq[0] = _mm256_fmadd_ps(lo, xb, aq[0]);
                    aq[1] = _mm256_fmadd_ps(hi, xb, aq[1]);
                }
            }
        }
        for (q, aq) in acc.iter().enumerate() {
            // SAFETY: `(i0 + q)·PANEL + PANEL <= n·PANEL`.
            unsafe {
                let at = op.add((i0 + q) * PANEL);
                _mm256_storeu_ps(at, aq[0]);
                _mm256_storeu_ps(at.add(8), aq[1]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                h as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// `x · Wᵀ (+ b)` in f64, the oracle.
    fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
        let mut y = vec![0f64; n * rows];
        for i in 0..n {
            for o in 0..rows {
                y[i * rows + o] = (0..cols)
                    .map(|k| f64::from(w[o * cols + k]) * f64::from(x[i * cols + k]))
                    .sum();
            }
        }
        y
    }

    #[test]
    fn pack_round_trips_and_rejects_bad_lengths() {
        for (rows, cols) in [(1, 1), (5, 3), (16, 7), (17, 2), (33, 40)] {
            let w = values(rows * cols, 3);
            let p = PackedMatrix::pack(&w, rows, cols).unwrap();
            assert_eq!(p.unpack(), w);
            assert_eq!((p.rows(), p.cols()), (rows, cols));
            assert_eq!(
                p,
                PackedMatrix::pack_with(rows, cols, |o, k| w[o * cols + k])
            );
            // Wᵀ from a strided [cols, rows] view of a wider buffer.
            let stride = rows + 3;
            let a: Vec<f32> = (0..cols * stride)
                .map(|i| {
                    if i % stride < rows {
                        w[(i % stride) * cols + i / stride]
                    } else {
                        9.0
                    }
                })
                .collect();
            assert_eq!(PackedMatrix::pack_transposed(&a, stride, rows, cols), p);
        }
        assert!(PackedMatrix::pack(&[1.0; 5], 2, 3).is_none());
        // Empty products: no rows in, no outputs, or no inputs (zeros).
        let p = PackedMatrix::pack(&[1.0; 6], 2, 3).unwrap();
        assert_eq!(p.matmul(&[], 0, None).unwrap(), Vec::<f32>::new());
        let none = PackedMatrix::pack(&[], 0, 3).unwrap();
        assert_eq!(none.matmul(&[1.0; 6], 2, None).unwrap(), Vec::<f32>::new());
        let flat = PackedMatrix::pack(&[], 17, 0).unwrap();
        assert_eq!(
            flat.matmul(&[], 2, Some(&[1.0; 17])).unwrap(),
            vec![1.0; 34]
        );
        let p = PackedMatrix::pack(&[1.0; 6], 2, 3).unwrap();
        assert!(p.matmul(&[1.0; 5], 2, None).is_none());
        assert!(p.matmul(&[1.0; 6], 2, Some(&[0.0; 3])).is_none());
    }

    #[test]
    fn every_kernel_matches_the_oracle_and_each_other_bit_for_bit() {
        // Row counts around panel and panel-group edges, row counts around tile splits.
        for (rows, cols) in [
            (1, 5),
            (15, 8),
            (16, 16),
            (17, 9),
            (64, 33),
            (100, 24),
            (131, 3),
        ] {
            let w = values(rows * cols, 11);
            let p = PackedMatrix::pack(&w, rows, cols).unwrap();
            let bias = values(rows, 5);
            for n in [1, 2, 5, 6, 7, 9, 13, 40] {
                let x = values(n * cols, n as u32);
                let want = reference(&w, rows, cols, &x, n);
                let port = p.matmul_with(Kernel::Portable, &x, n, None).unwrap();
                for (a, b) in port.iter().zip(&want) {
                    assert!(
                        (f64::from(*a) - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{a} vs {b}"
                    );
                }
                for k in [Kernel::Avx2, Kernel::Avx512] {
                    let got = p.matmul_with(k, &x, n, None).unwrap();
                    assert_eq!(got, port, "{k:?} rows {rows} cols {cols} n {n}");
                }
                let with_bias = p.matmul(&x, n, Some(&bias)).unwrap();
                for (i, row) in with_bias.chunks(rows).enumerate() {
                    for (o, v) in row.iter().enumerate() {
                        assert_eq!(*v, port[i * rows + o] + bias[o]);
                    }
                }
            }
        }
    }

    #[test]
    fn the_pool_split_gives_the_same_bits() {
        // Enough work to cross PAR_MIN_MACS, so the panels are split over the pool.
        let (rows, cols, n) = (1000, 512, 20);
        assert!(rows * cols * n >= PAR_MIN_MACS);
        let w = values(rows * cols, 1);
        let p = PackedMatrix::pack(&w, rows, cols).unwrap();
        let x = values(n * cols, 2);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let split = pool.install(|| p.matmul(&x, n, None).unwrap());
        let inline = p.matmul_with(Kernel::Portable, &x, n, None).unwrap();
        assert_eq!(split, inline);
    }

    #[test]
    fn strided_views_give_the_packed_bits_and_refuse_short_data() {
        // Wᵀ of a token-major [S, 2 heads, 32] buffer, head 1, read in place: panel p, column
        // k is row k's dimensions 16p..16p+16; and the same keys transposed with capacity 48.
        let (s, hd, stride, cap) = (21, 32, 64, 48);
        let v = values(s * stride, 4);
        let packed = PackedMatrix::pack_transposed(&v[hd..], stride, hd, s);
        let view = PanelView::new(&v[hd..], hd, s, PANEL, stride).unwrap();
        let mut kt = vec![f32::NAN; hd * cap];
        for j in 0..s {
            for d in 0..hd {
                kt[d * cap + j] = v[j * stride + hd + d];
            }
        }
        let keys = PackedMatrix::pack_strided(&v[hd..], stride, s, hd);
        let kview = PanelView::new(&kt, s, hd, PANEL, cap).unwrap();
        for n in [1, 3, 7, 12, 13] {
            for k in [Kernel::Portable, Kernel::Avx2, Kernel::Avx512] {
                let x = values(n * s, n as u32);
                assert_eq!(
                    view.matmul_with(k, &x, n, None),
                    packed.matmul_with(k, &x, n, None)
                );
                let x = values(n * hd, n as u32 + 9);
                assert_eq!(
                    kview.matmul_with(k, &x, n, None),
                    keys.matmul_with(k, &x, n, None)
                );
            }
        }
        // The last panel's 16 lanes of the last column must lie inside the data.
        assert!(PanelView::new(&v[hd..], hd, s, PANEL, stride + 1).is_none());
        assert!(PanelView::new(&kt, cap, hd, PANEL, cap).is_some());
        assert!(PanelView::new(&kt, cap + 1, hd, PANEL, cap).is_none());
        assert!(PanelView::new(&kt[..hd * cap - 1], cap, hd, PANEL, cap).is_none());
        assert!(PanelView::new(&[], 0, 5, PANEL, 1).is_some());
    }
}
