//! [`PanelView`]: a borrowed panel-layout matrix and the products of its panels (the pool
//! split is `group.rs`'s).

use super::dst::{Dst, row_tiles};
use super::tile::{input_width, tile, tiling};
use super::{Kernel, PANEL, PanelElem};

/// A borrowed `W: [rows, cols]` in panel layout at any strides: panel `p`, column `k`, lane `j`
/// (`W[p·PANEL + j, k]`) is `data[p · panel_stride + k · col_stride + j]`. Lanes past `rows` in
/// the last panel are read but their outputs are dropped, so they may hold anything finite or
/// not. A [`super::PackedMatrix`] is the contiguous case; a cache whose rows already sit in
/// this layout (attention's values `Vᵀ`: panel `p`, column `k` is key `k`'s dimensions
/// `16p ..`) is multiplied where it lies, with no packing, and gives the same bits as packing
/// it first.
///
/// bf16 stores columns in pairs ([`PanelElem::PAIR`] = 2): `col_stride` steps from one pair
/// slot to the next, and column `k`, lane `j` is
/// `data[p · panel_stride + (k / 2) · col_stride + 2j + k % 2]`. With an odd `cols`, the last slot's
/// second column is read too and multiplied by `0`: it must be finite (packing zeroes it).
#[derive(Debug, Clone, Copy)]
pub struct PanelView<'a, T: PanelElem = f32> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    panel_stride: usize,
    col_stride: usize,
}

impl<'a, T: PanelElem> PanelView<'a, T> {
    /// The view, or `None` when a lane of some panel's column would lie outside `data`.
    pub fn new(
        data: &'a [T],
        rows: usize,
        cols: usize,
        panel_stride: usize,
        col_stride: usize,
    ) -> Option<Self> {
        if rows > 0 && cols > 0 {
            let last = (rows.div_ceil(PANEL) - 1)
                .checked_mul(panel_stride)?
                .checked_add((cols.div_ceil(T::PAIR) - 1).checked_mul(col_stride)?)?
                .checked_add(T::PAIR * PANEL)?;
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

    /// The contiguous view of a packed matrix's `data` (which its constructors size).
    pub(super) fn contiguous(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            panel_stride: super::pairs::panel_len::<T>(cols),
            col_stride: T::PAIR * PANEL,
        }
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`in`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `y = x · Wᵀ (+ bias)` as [`super::PackedMatrix::matmul`], with the fastest kernel.
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
        super::group::matmul_group(kernel, &[(*self, bias)], x, n).map(|mut ys| ys.swap_remove(0))
    }

    /// The values of panels `p .. p + np` (from the first lane of the first to the last lane
    /// of the last column of the last).
    fn panels(&self, p: usize, np: usize) -> &'a [T] {
        let start = p * self.panel_stride;
        let slots = self.cols.div_ceil(T::PAIR);
        let end =
            (p + np - 1) * self.panel_stride + (slots - 1) * self.col_stride + T::PAIR * PANEL;
        &self.data[start..end]
    }

    /// Panels `p0 .. p0 + count` of `x · Wᵀ (+ bias)` into `dst` (whose `ptr` is row 0 of
    /// panel `p0`), `x` with its row tiles interleaved by column (`tile::interleave`).
    ///
    /// # Safety
    /// `dst` must be writable at `i·row_stride + r·panel_stride + j` for every row `i < n`,
    /// panel `r < count` and lane `j` (`j < PANEL`, or `j < last_width` in the matrix's last
    /// panel), and `dst.bias`, when not null, readable at `rows` values from the matrix's first
    /// output.
    pub(super) unsafe fn panels_into(
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
        let panels = self.rows.div_ceil(PANEL);
        let last_width = self.rows - (panels - 1) * PANEL;
        let (group, max_rows) = tiling(kernel, n);
        let width = input_width::<T>(kernel, cols);
        // No software prefetch of the next group: the tiles read each panel as one forward
        // stream (measured against prefetching the group after next: the same or faster at
        // 1-16 rows), and the x86 tiles prefetch inside that stream (`x86::PREFETCH_AHEAD`).
        let mut g = 0;
        while g < count {
            let p = p0 + g;
            let np = group.min(count - g);
            let w = self.panels(p, np);
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
            for (i0, m) in row_tiles(n, max_rows) {
                let xs = &x[i0 * width..(i0 + m) * width];
                let tile_dst = Dst {
                    // SAFETY: row `i0 < n`.
                    ptr: unsafe { group_dst.ptr.add(i0 * dst.row_stride) },
                    ..group_dst
                };
                // SAFETY: rows `i0 .. i0 + m` of panels `p .. p + np`, in bounds as above.
                unsafe { tile(kernel, w, np, cols, strides, xs, m, tile_dst) };
            }
            g += np;
        }
    }
}
