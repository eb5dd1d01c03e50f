//! [`PanelView`]: a borrowed panel-layout matrix, its product, and the split of a product's
//! panels over the thread pool.

use rayon::prelude::*;

use super::tile::{Dst, interleave, row_tiles, tile, tiling};
use super::{Kernel, PANEL, PanelElem};
use crate::cpu::par::PAR_MIN_MACS;

/// Panels per pool task are a multiple of this (the widest register tile's group).
const TASK_PANELS: usize = 4;

/// Pool tasks per pool thread of a split product: several, so that a worker slowed by another
/// process leaves its share to be stolen.
const TASKS_PER_THREAD: usize = 4;

/// A borrowed `W: [rows, cols]` in panel layout at any strides: panel `p`, column `k`, lane `j`
/// (`W[p·PANEL + j, k]`) is `data[p · panel_stride + k · col_stride + j]`. Lanes past `rows` in
/// the last panel are read but their outputs are dropped, so they may hold anything finite or
/// not. A [`super::PackedMatrix`] is the contiguous case; a cache whose rows already sit in
/// this layout (attention's values `Vᵀ`: panel `p`, column `k` is key `k`'s dimensions
/// `16p ..`) is multiplied where it lies, with no packing, and gives the same bits as packing
/// it first.
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

    /// The contiguous view of a packed matrix's `data` (which its constructors size).
    pub(super) fn contiguous(data: &'a [T], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            panel_stride: cols * PANEL,
            col_stride: PANEL,
        }
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
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
        let kernel = kernel.or_portable();
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
        // The tiles write `y` in place, row-major with the bias added, so no staging buffer is
        // zeroed and nothing is copied (measured: +15–20% tokens/s for 16 concurrent
        // speculative requests on the bundled pair).
        let mut y: Vec<f32> = Vec::with_capacity(n * rows);
        let dst = Dst {
            ptr: y.spare_capacity_mut().as_mut_ptr().cast(),
            row_stride: rows,
            panel_stride: PANEL,
            last_width: rows - (panels - 1) * PANEL,
            bias: bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
        };
        let tasks = self.pool_tasks(n);
        // The tiles read their rows interleaved by column (one input stream beside the
        // weights', not one per row; measured on the memory-bound pair's MLP at 9 rows: f32
        // 5-10% faster). One row is its own interleaving.
        let interleaved;
        let x = if n > 1 {
            interleaved = interleave(x, n, cols, tiling(kernel, n).1);
            &interleaved[..]
        } else {
            x
        };
        if tasks > 1 {
            // Each task writes its own panels' lanes of every row. Raw pointers are not `Send`:
            // they go over as addresses.
            let per = panels.div_ceil(tasks).next_multiple_of(TASK_PANELS);
            let (at, bias_at) = (dst.ptr as usize, dst.bias as usize);
            (0..panels.div_ceil(per)).into_par_iter().for_each(|c| {
                let p0 = c * per;
                let task = Dst {
                    // SAFETY (offset): panel `p0 < panels` starts at output `p0·PANEL < rows`.
                    ptr: unsafe { (at as *mut f32).add(p0 * PANEL) },
                    bias: bias_at as *const f32,
                    ..dst
                };
                // SAFETY: `y` has room for row `i`, output `o` at `i·rows + o`; this task's
                // outputs (panels `p0 ..`) are disjoint from every other task's.
                unsafe { self.panels_into(kernel, x, n, p0, per.min(panels - p0), task) }
            });
        } else {
            // SAFETY: as above, all panels on this thread.
            unsafe { self.panels_into(kernel, x, n, 0, panels, dst) };
        }
        // SAFETY: the tiles wrote every one of the `n · rows` values (all rows, every panel,
        // the last one's `last_width` lanes).
        unsafe { y.set_len(n * rows) };
        Some(y)
    }

    /// Pool tasks for a product of `n` rows: 1 (inline) unless it is worth the pool, either
    /// for its multiply-adds ([`crate::threads::use_pool`] from [`PAR_MIN_MACS`]) or for the
    /// weight bytes it streams ([`crate::threads::split_stream`]).
    fn pool_tasks(&self, n: usize) -> usize {
        let panels = self.rows.div_ceil(PANEL);
        if panels <= TASK_PANELS {
            return 1;
        }
        let work = n.saturating_mul(self.rows).saturating_mul(self.cols);
        let bytes = (panels * self.cols * PANEL).saturating_mul(std::mem::size_of::<T>());
        let pool = (work >= PAR_MIN_MACS && crate::threads::use_pool(work))
            || crate::threads::split_stream(bytes);
        if pool {
            rayon::current_num_threads() * TASKS_PER_THREAD
        } else {
            1
        }
    }

    /// The values of panels `p .. p + np` (from the first lane of the first to the last lane
    /// of the last column of the last).
    fn panels(&self, p: usize, np: usize) -> &'a [T] {
        let start = p * self.panel_stride;
        let end = (p + np - 1) * self.panel_stride + (self.cols - 1) * self.col_stride + PANEL;
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
        let panels = self.rows.div_ceil(PANEL);
        let last_width = self.rows - (panels - 1) * PANEL;
        let (group, max_rows) = tiling(kernel, n);
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
                let xs = &x[i0 * cols..(i0 + m) * cols];
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
