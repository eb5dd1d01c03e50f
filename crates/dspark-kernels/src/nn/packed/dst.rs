//! Where the register tiles write ([`Dst`]) and how a product's rows are cut into tiles
//! ([`row_tiles`]): the leaf every tile body (`tile.rs`, `pairs.rs`, `x86.rs`, `pairs_x86.rs`)
//! shares, so that the dispatch imports the bodies and no body imports the dispatch.

use super::PANEL;

/// Where a tile's sums go: row `q`, panel `r` (of the tile's group), lane `j` is
/// `ptr[q·row_stride + r·panel_stride + j]`, plus `bias[r·PANEL + j]` unless `bias` is null;
/// the group's last panel keeps its first `last_width` lanes (the matrix's partial last panel),
/// every other panel all [`PANEL`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Dst {
    pub(super) ptr: *mut f32,
    pub(super) row_stride: usize,
    pub(super) panel_stride: usize,
    pub(super) last_width: usize,
    pub(super) bias: *const f32,
}

impl Dst {
    /// Write the sums `lanes` of row `q`, panel `r` of a group of `np` panels: `lanes[j]`
    /// (`+ bias`) for each kept lane, the same single add as a bias applied afterwards.
    ///
    /// # Safety
    /// As `PanelView::panels_into`: the kept lanes (and their biases) are in bounds.
    #[inline(always)]
    pub(super) unsafe fn put(&self, q: usize, r: usize, np: usize, lanes: &[f32; PANEL]) {
        let width = if r + 1 == np { self.last_width } else { PANEL };
        // SAFETY: by the caller's contract.
        unsafe {
            let at = self.ptr.add(q * self.row_stride + r * self.panel_stride);
            if self.bias.is_null() {
                if width == PANEL {
                    // One 64-byte copy the compiler inlines (not a call for a runtime length).
                    at.cast::<[f32; PANEL]>().write_unaligned(*lanes);
                } else {
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), at, width);
                }
            } else {
                let b = self.bias.add(r * PANEL);
                for (j, &v) in lanes.iter().enumerate().take(width) {
                    *at.add(j) = v + *b.add(j);
                }
            }
        }
    }

    /// The portable tiles' walk over a tile of `m` rows × `np` panels: panel by panel, row by
    /// row, the sums `sums(r, q)` of row `q`, panel `r`, each [put](Self::put) when done.
    ///
    /// # Safety
    /// As [`Self::put`], for every row and panel of the tile.
    #[inline(always)]
    pub(super) unsafe fn put_each(
        &self,
        m: usize,
        np: usize,
        mut sums: impl FnMut(usize, usize) -> [f32; PANEL],
    ) {
        for r in 0..np {
            for q in 0..m {
                let lanes = sums(r, q);
                // SAFETY: by the caller's contract.
                unsafe { self.put(q, r, np, &lanes) };
            }
        }
    }
}

/// The row tiles of a product of `n` rows with tiles of at most `max_rows`: `(first row, rows)`
/// of each, in order. The first tile is full (`min(n, max_rows)` rows) and the rest share the
/// remaining rows evenly (sizes differ by at most one).
///
/// The first tile of a panel group streams the group from memory; the others read it from L2.
/// A memory-bound stream leaves the FMA ports idle for most of its time, so the first tile
/// takes as many rows as a tile holds for free, and only the remainder pays for its
/// multiply-adds on an L2 pass (faster than balanced tiles at 13 to 18 rows in f32 on the
/// memory-bound pair; bf16 within noise). The bits are each row's alone, whatever the split.
pub(super) fn row_tiles(n: usize, max_rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let max_rows = max_rows.max(1);
    let first = n.min(max_rows);
    let rest = n - first;
    let tiles = rest.div_ceil(max_rows);
    let head = (first > 0).then_some((0, first));
    head.into_iter().chain((0..tiles).scan(first, move |i0, t| {
        let m = rest / tiles + usize::from(t < rest % tiles);
        let at = *i0;
        *i0 += m;
        Some((at, m))
    }))
}
