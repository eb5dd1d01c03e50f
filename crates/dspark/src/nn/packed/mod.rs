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
//! The tiles store their sums straight into the row-major result (bias added there, the same
//! single add), so a decode or verify step allocates its output once and copies nothing. Large
//! products (prefill) split the panels over the thread pool under the policy of
//! [`crate::threads`], each task into its own panel-major chunk, then one copy into rows.
//! The register tiles themselves are in `x86.rs`.

use rayon::prelude::*;

use crate::cpu::par::PAR_MIN_MACS;

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
            if crate::cpu::has_avx512() {
                return Self::Avx512;
            }
            if crate::cpu::has_avx2() {
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
        if n == 0 || rows == 0 || cols == 0 {
            // No inputs (or no outputs): every product is 0, then + bias.
            let mut y = vec![0f32; n * rows];
            if let Some(b) = bias {
                for row in y.chunks_exact_mut(rows.max(1)) {
                    row.copy_from_slice(b);
                }
            }
            return Some(y);
        }
        let panels = rows.div_ceil(PANEL);
        let bias = bias.map_or(std::ptr::null(), <[f32]>::as_ptr);
        let work = n.saturating_mul(rows).saturating_mul(cols);
        if panels > 1 && work >= PAR_MIN_MACS && crate::threads::use_pool(work) {
            // Panel-major `[panel][n][PANEL]`: every task writes whole panels of its own chunk
            // (bias added), then one copy into rows. Raw pointers are not `Send`: the bias goes
            // over as an address.
            let per = panels
                .div_ceil(rayon::current_num_threads() * 4)
                .next_multiple_of(PANELS_512);
            let mut yp = vec![0f32; panels * n * PANEL];
            let bias_at = bias as usize;
            yp.par_chunks_mut(per * n * PANEL)
                .enumerate()
                .for_each(|(c, out)| {
                    let dst = Dst {
                        ptr: out.as_mut_ptr(),
                        row_stride: PANEL,
                        panel_stride: n * PANEL,
                        last_width: PANEL,
                        bias: bias_at as *const f32,
                    };
                    let np = out.len() / (n * PANEL);
                    // SAFETY: `out` holds panels `c·per ..+ np`, `n` rows × PANEL lanes each.
                    unsafe { self.panels_into(kernel, x, n, c * per, np, dst) }
                });
            let mut y = vec![0f32; n * rows];
            for (p, block) in yp.chunks_exact(n * PANEL).enumerate() {
                let (o0, width) = (p * PANEL, PANEL.min(rows - p * PANEL));
                for (i, lanes) in block.chunks_exact(PANEL).enumerate() {
                    y[i * rows + o0..i * rows + o0 + width].copy_from_slice(&lanes[..width]);
                }
            }
            return Some(y);
        }
        // Inline (every decode and verify step): the tiles write `y` in place, row-major with
        // the bias added, so no staging buffer is zeroed and nothing is copied (measured:
        // +15–20% tokens/s for 16 concurrent speculative requests on the bundled pair).
        let mut y: Vec<f32> = Vec::with_capacity(n * rows);
        let dst = Dst {
            ptr: y.spare_capacity_mut().as_mut_ptr().cast(),
            row_stride: rows,
            panel_stride: PANEL,
            last_width: rows - (panels - 1) * PANEL,
            bias,
        };
        // SAFETY: `y` has room for `n · rows` values, row `i` output `o` at `i·rows + o`; the
        // tiles write every one of them (all rows, every panel, the last one's `last_width`
        // lanes), so the length can then be set.
        unsafe {
            self.panels_into(kernel, x, n, 0, panels, dst);
            y.set_len(n * rows);
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

    /// Panels `p0 .. p0 + count` of `x · Wᵀ (+ bias)` into `dst` (whose `ptr` is row 0 of
    /// panel `p0`).
    ///
    /// # Safety
    /// `dst` must be writable at `i·row_stride + r·panel_stride + j` for every row `i < n`,
    /// panel `r < count` and lane `j` (`j < PANEL`, or `j < last_width` in the matrix's last
    /// panel), and `dst.bias`, when not null, readable at `rows` values from the matrix's first
    /// output.
    unsafe fn panels_into(
        &self,
        kernel: Kernel,
        x: &[f32],
        n: usize,
        p0: usize,
        count: usize,
        dst: Dst,
    ) {
        let cols = self.cols;
        let strides = (self.panel_stride, self.col_stride);
        let contiguous = strides == (cols * PANEL, PANEL);
        let panels = self.rows.div_ceil(PANEL);
        let last_width = self.rows - (panels - 1) * PANEL;
        let (group, max_rows) = tiling(kernel, n);
        let mut g = 0;
        while g < count {
            let p = p0 + g;
            let np = group.min(count - g);
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
            let group_dst = Dst {
                // SAFETY (offsets): inside `dst` by the contract above.
                ptr: unsafe { dst.ptr.add(g * dst.panel_stride) },
                last_width: if p + np == panels { last_width } else { PANEL },
                bias: if dst.bias.is_null() {
                    dst.bias
                } else {
                    // SAFETY: panel `p` starts at output `p·PANEL < rows`.
                    unsafe { dst.bias.add(p * PANEL) }
                },
                ..dst
            };
            let tiles = n.div_ceil(max_rows);
            let mut i0 = 0;
            for t in 0..tiles {
                let m = n / tiles + usize::from(t < n % tiles);
                let xs = &x[i0 * cols..(i0 + m) * cols];
                let ahead = if t == 0 { next } else { &[] };
                let tile_dst = Dst {
                    // SAFETY: row `i0 < n`.
                    ptr: unsafe { group_dst.ptr.add(i0 * dst.row_stride) },
                    ..group_dst
                };
                // SAFETY: rows `i0 .. i0 + m` of panels `p .. p + np`, in bounds as above.
                unsafe { tile(kernel, w, np, cols, strides, xs, m, tile_dst, ahead) };
                i0 += m;
            }
            g += np;
        }
    }
}

/// Where a tile's sums go: row `q`, panel `r` (of the tile's group), lane `j` is
/// `ptr[q·row_stride + r·panel_stride + j]`, plus `bias[r·PANEL + j]` unless `bias` is null;
/// the group's last panel keeps its first `last_width` lanes (the matrix's partial last panel),
/// every other panel all [`PANEL`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Dst {
    ptr: *mut f32,
    row_stride: usize,
    panel_stride: usize,
    last_width: usize,
    bias: *const f32,
}

impl Dst {
    /// Write the sums `lanes` of row `q`, panel `r` of a group of `np` panels: `lanes[j]`
    /// (`+ bias`) for each kept lane, the same single add as a bias applied afterwards.
    ///
    /// # Safety
    /// As [`PanelView::panels_into`]: the kept lanes (and their biases) are in bounds.
    #[inline(always)]
    pub(super) unsafe fn put(&self, q: usize, r: usize, np: usize, lanes: &[f32; PANEL]) {
        let width = if r + 1 == np { self.last_width } else { PANEL };
        // SAFETY: by the caller's contract.
        unsafe {
            let at = self.ptr.add(q * self.row_stride + r * self.panel_stride);
            if self.bias.is_null() {
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), at, width);
            } else {
                let b = self.bias.add(r * PANEL);
                for (j, &v) in lanes.iter().enumerate().take(width) {
                    *at.add(j) = v + *b.add(j);
                }
            }
        }
    }
}

/// `m` rows `xs` × `np` panels `w` into `dst` (its `ptr` at the tile's first row and the
/// group's first panel), prefetching `ahead` (the next panels, or nothing) on the way.
/// Dispatches to a monomorphized kernel.
///
/// # Safety
/// `dst` as in [`PanelView::panels_into`] for `m` rows and `np` panels.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    kernel: Kernel,
    w: &[f32],
    np: usize,
    cols: usize,
    strides: (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
    ahead: &[f32],
) {
    debug_assert!(w.len() == (np - 1) * strides.0 + (cols - 1) * strides.1 + PANEL);
    debug_assert!(xs.len() == m * cols);
    debug_assert!(m <= TILE_ROWS && np >= 1);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => {
            macro_rules! go {
                ($($m:literal),*) => {
                    match (m, np) {
                        $(
                            ($m, 4) => x86::tile512::<$m, 4>(w, cols, strides, xs, dst, ahead),
                            ($m, 3) => x86::tile512::<$m, 3>(w, cols, strides, xs, dst, ahead),
                            ($m, 2) => x86::tile512::<$m, 2>(w, cols, strides, xs, dst, ahead),
                            ($m, _) => x86::tile512::<$m, 1>(w, cols, strides, xs, dst, ahead),
                        )*
                        _ => {}
                    }
                };
            }
            macro_rules! go_wide {
                ($($m:literal),*) => {
                    match (m, np) {
                        $(
                            ($m, 2) => x86::tile512::<$m, 2>(w, cols, strides, xs, dst, ahead),
                            ($m, _) => x86::tile512::<$m, 1>(w, cols, strides, xs, dst, ahead),
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
                } else {
                    go_wide!(7, 8, 9, 10, 11, 12)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            // SAFETY: `Kernel::Avx2` is only chosen when the CPU supports AVX2 and FMA; `dst`
            // by the caller's contract.
            unsafe {
                match m {
                    1 => x86::tile256::<1>(w, cols, strides, xs, dst, ahead),
                    2 => x86::tile256::<2>(w, cols, strides, xs, dst, ahead),
                    3 => x86::tile256::<3>(w, cols, strides, xs, dst, ahead),
                    4 => x86::tile256::<4>(w, cols, strides, xs, dst, ahead),
                    5 => x86::tile256::<5>(w, cols, strides, xs, dst, ahead),
                    _ => x86::tile256::<6>(w, cols, strides, xs, dst, ahead),
                }
            }
        }
        _ => {
            let _ = ahead;
            // SAFETY: by the caller's contract.
            unsafe { tile_portable(w, np, cols, strides, xs, m, dst) }
        }
    }
}

/// Plain-Rust tile (any `m`, `np`).
///
/// # Safety
/// `dst` as in [`tile`].
unsafe fn tile_portable(
    w: &[f32],
    np: usize,
    cols: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
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
            // SAFETY: by the caller's contract.
            unsafe { dst.put(q, r, np, &acc) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_values::values;

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
        // The bias is added by the tiles on both paths: the same bits.
        let bias = values(rows, 3);
        let split = pool.install(|| p.matmul(&x, n, Some(&bias)).unwrap());
        let inline = crate::threads::in_round(|| p.matmul(&x, n, Some(&bias)).unwrap());
        assert_eq!(split, inline);
        let shifted: Vec<f32> = p
            .matmul_with(Kernel::Portable, &x, n, None)
            .unwrap()
            .chunks(rows)
            .flat_map(|row| row.iter().zip(&bias).map(|(a, b)| a + b))
            .collect();
        assert_eq!(split, shifted);
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
