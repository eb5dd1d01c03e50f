//! Products of one input against several matrices in one pool dispatch: a layer's q, k and v
//! projections, its gate and up projections. Every product, a group of one included, goes
//! through here.
//!
//! A dispatch costs more than its join: between two products the layer runs its norms, rope
//! and attention on one thread, the other worker goes to sleep, and the next product wakes it
//! (a futex, then the scheduler; tens of microseconds on a VM) and ends on the slower half.
//! Against a 4 MB k projection (0.2 ms of reading) that is a large share. Grouping the
//! products of one input pays it once for the group (measured on the memory-bound pair at
//! 1 and 9 rows: see `benches/results/README.md`), and interleaves the input once.
//!
//! The bits are each product's alone: every output is computed by the same tile, over the
//! same row tiles, whatever the group and the split.

use rayon::prelude::*;

use super::dst::Dst;
use super::tile::inputs;
use super::{Kernel, PANEL, PanelElem, PanelView};

/// One product of a group: the weight and its bias (`rows` values), if any.
pub type GroupPart<'a, T> = (PanelView<'a, T>, Option<&'a [f32]>);
use crate::cpu::par::PAR_MIN_MACS;

/// Panels per pool task are a multiple of this (the widest register tile's group).
const TASK_PANELS: usize = 4;

/// Pool tasks per pool thread of a split dispatch: several, so that a worker slowed by another
/// process leaves its share to be stolen.
const TASKS_PER_THREAD: usize = 4;

/// `y_i = x · W_iᵀ (+ bias_i)` for each `(W_i, bias_i)` of `parts`, with `kernel` (the
/// portable one when it is not [available](Kernel::available)), in one pool dispatch: row-major
/// `x: [n, cols]` gives row-major `[n, rows_i]` per part, the same bits as each product alone.
/// `None` when a part's width is not `x`'s (`x.len() != n · cols`) or a bias is not `rows_i`
/// long.
pub fn matmul_group<T: PanelElem>(
    kernel: Kernel,
    parts: &[GroupPart<'_, T>],
    x: &[f32],
    n: usize,
) -> Option<Vec<Vec<f32>>> {
    let kernel = kernel.or_portable().for_elem::<T>();
    let cols = parts.first().map_or(0, |(w, _)| w.cols());
    let fits =
        |(w, b): &GroupPart<'_, T>| w.cols() == cols && b.is_none_or(|b| b.len() == w.rows());
    if n.checked_mul(cols) != Some(x.len()) || !parts.iter().all(fits) {
        return None;
    }
    let mut ys: Vec<Vec<f32>> = parts
        .iter()
        .map(|(w, _)| Vec::with_capacity(n * w.rows()))
        .collect();
    if n == 0 || cols == 0 {
        // No inputs (or no columns): every product is 0, then + bias.
        for (y, (w, b)) in ys.iter_mut().zip(parts) {
            y.resize(n * w.rows(), 0.0);
            if let (Some(b), true) = (b, w.rows() > 0) {
                for row in y.chunks_exact_mut(w.rows()) {
                    row.copy_from_slice(b);
                }
            }
        }
        return Some(ys);
    }
    // The tiles write each `y_i` in place, row-major with the bias added, so no staging buffer
    // is zeroed and nothing is copied (measured: +15–20% tokens/s for 16 concurrent
    // speculative requests on the bundled pair).
    let dsts: Vec<Dst> = ys
        .iter_mut()
        .zip(parts)
        .map(|(y, (w, b))| {
            let panels = w.rows().div_ceil(PANEL).max(1);
            Dst {
                ptr: y.spare_capacity_mut().as_mut_ptr().cast(),
                row_stride: w.rows(),
                panel_stride: PANEL,
                last_width: w.rows() + PANEL - panels * PANEL,
                bias: b.map_or(std::ptr::null(), <[f32]>::as_ptr),
            }
        })
        .collect();
    // The tiles read their rows interleaved by column (one input stream beside the weights',
    // not one per row; measured on the memory-bound pair's MLP at 9 rows: f32 5-10% faster).
    // One f32 / f16 row is its own interleaving; bf16 rounds its inputs into pairs.
    let x = inputs::<T>(kernel, x, n, cols);
    let x = &x[..];
    let tasks = pool_tasks(parts, n);
    let panels: Vec<usize> = parts
        .iter()
        .map(|(w, _)| w.rows().div_ceil(PANEL))
        .collect();
    if tasks > 1 {
        // Each task is a run of one part's panels and writes those panels' lanes of every
        // row. Raw pointers are not `Send`: they go over as addresses.
        let total: usize = panels.iter().sum();
        let per = total.div_ceil(tasks).next_multiple_of(TASK_PANELS);
        let runs: Vec<(usize, usize, usize)> = panels
            .iter()
            .enumerate()
            .flat_map(|(i, &np)| {
                (0..np)
                    .step_by(per)
                    .map(move |p0| (i, p0, per.min(np - p0)))
            })
            .collect();
        let sent: Vec<[usize; 4]> = dsts
            .iter()
            .map(|d| [d.ptr as usize, d.bias as usize, d.row_stride, d.last_width])
            .collect();
        runs.into_par_iter().for_each(|(i, p0, count)| {
            let [at, bias, row_stride, last_width] = sent[i];
            let task = Dst {
                // SAFETY (offset): panel `p0 < panels` starts at output `p0·PANEL < rows`.
                ptr: unsafe { (at as *mut f32).add(p0 * PANEL) },
                row_stride,
                panel_stride: PANEL,
                last_width,
                bias: bias as *const f32,
            };
            // SAFETY: `ys[i]` has room for row `r`, output `o` at `r·rows + o`; this task's
            // outputs (panels `p0 ..` of part `i`) are disjoint from every other task's.
            unsafe { parts[i].0.panels_into(kernel, x, n, p0, count, task) }
        });
    } else {
        for (i, (w, _)) in parts.iter().enumerate() {
            if panels[i] > 0 {
                // SAFETY: as above, all panels of part `i` on this thread.
                unsafe { w.panels_into(kernel, x, n, 0, panels[i], dsts[i]) };
            }
        }
    }
    for (y, (w, _)) in ys.iter_mut().zip(parts) {
        // SAFETY: the tiles wrote every one of the `n · rows` values of each part (all rows,
        // every panel, the last one's `last_width` lanes).
        unsafe { y.set_len(n * w.rows()) };
    }
    Some(ys)
}

/// Pool tasks for a group of `n` rows: 1 (inline) unless it is worth the pool, either for its
/// multiply-adds ([`crate::threads::use_pool`] from [`PAR_MIN_MACS`]) or for the weight bytes
/// it streams times its rows ([`crate::threads::split_product`]).
fn pool_tasks<T: PanelElem>(parts: &[GroupPart<'_, T>], n: usize) -> usize {
    let panels: usize = parts.iter().map(|(w, _)| w.rows().div_ceil(PANEL)).sum();
    if panels <= TASK_PANELS {
        return 1;
    }
    let cols = parts.first().map_or(0, |(w, _)| w.cols());
    let rows: usize = parts.iter().map(|(w, _)| w.rows()).sum();
    let work = n.saturating_mul(rows).saturating_mul(cols);
    let bytes = (panels * cols * PANEL).saturating_mul(std::mem::size_of::<T>());
    let pool = (work >= PAR_MIN_MACS && crate::threads::use_pool(work))
        || crate::threads::split_product(bytes, n);
    if pool {
        rayon::current_num_threads() * TASKS_PER_THREAD
    } else {
        1
    }
}
