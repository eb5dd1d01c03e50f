//! Group products: several weights multiplied by one `x` in one pool dispatch (a layer's q, k
//! and v projections, its gate and up), the activations quantized once per format. Every
//! part's outputs are the bits of its own product.
//!
//! [`group_with`] runs parts of one format ([`Blocks`]); `mixed.rs` runs parts of several on
//! the same dispatch.

use rayon::prelude::*;

use super::QuantKernel;
use super::rule::GROUP;
#[cfg(target_arch = "x86_64")]
use super::simd::Operands;

/// Pool tasks per pool thread of a split product: several, so that a worker slowed by another
/// process leaves its share to be stolen (as the panel products split theirs).
const TASKS_PER_THREAD: usize = 4;

/// A weight in blocks of a quantized format, as a group product runs it: rows in groups of
/// [`GROUP`], activations quantized per row before the product.
pub(crate) trait Blocks: Sync {
    /// The activations, quantized per row.
    type Acts: Sync;

    /// `(rows, cols)`.
    fn shape(&self) -> (usize, usize);

    /// Bytes of the blocks.
    fn bytes(&self) -> usize;

    /// Row-major `x: [n, cols]` quantized per row.
    fn acts(x: &[f32], n: usize, cols: usize) -> Self::Acts;

    /// Outputs `o0 .. o0 + out.len() / n` (`o0` a multiple of [`GROUP`]) of every row into
    /// `out` (`[n, width]`) with `kernel`.
    fn run(&self, kernel: QuantKernel, q: &Self::Acts, n: usize, o0: usize, out: &mut [f32]);
}

/// An x86 body of a format's product: every output of the call's groups (see [`Bodies::run`]).
#[cfg(target_arch = "x86_64")]
pub(crate) type X86Body<W, X> = unsafe fn(&Operands<'_, W, X>, usize, &mut [f32]);

/// A format's product bodies, all with the same bits: the rule's one output, and on x86 one
/// body per SIMD kernel.
pub struct Bodies<W: 'static, X: 'static> {
    /// The rule: output slot `j` of a group's blocks `w` against row `r` of the activations.
    pub(crate) dot: fn(&[W], usize, &X, usize) -> f32,
    /// The AMX, AVX-512 VNNI, AVX-VNNI and AVX2 bodies (the order of [`QuantKernel::ALL`]).
    #[cfg(target_arch = "x86_64")]
    pub(crate) x86: [X86Body<W, X>; 4],
}

impl<W, X> Bodies<W, X> {
    /// Outputs `o0 .. o0 + out.len() / n` (`o0` a multiple of [`GROUP`]) of every row of `q`
    /// into `out` (`[n, width]`) with `kernel`, which this CPU runs; `weight` holds `blocks`
    /// blocks a group, every group of the outputs, and `q` `n` rows of the same width.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        kernel: QuantKernel,
        weight: &[W],
        blocks: usize,
        q: &X,
        n: usize,
        o0: usize,
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Some(i) = QuantKernel::ALL[..4].iter().position(|&k| k == kernel) {
            let op = Operands::new(weight, blocks, q, n, o0, out.len());
            // SAFETY: the caller runs only a kernel whose extensions were detected, over
            // operands that hold every group of the outputs and `n` rows.
            unsafe { self.x86[i](&op, n, out) };
            return;
        }
        let width = out.len() / n.max(1);
        for r in 0..n {
            for j in 0..width {
                let o = o0 + j;
                let w = &weight[(o / GROUP) * blocks..][..blocks];
                out[r * width + j] = (self.dot)(w, o % GROUP, q, r);
            }
        }
    }
}

/// A part's `(rows, cols)` and bias.
pub(super) type Shape<'a> = ((usize, usize), Option<&'a [f32]>);

/// Whether `parts` (shapes and biases) fit one `x: [n, cols]`: `Some(cols)` when every part has
/// `x`'s width and each bias its part's rows.
pub(super) fn fits(parts: &[Shape<'_>], x: &[f32], n: usize) -> Option<usize> {
    let ((_, cols), _) = *parts.first()?;
    let ok = |&((rows, c), b): &Shape<'_>| c == cols && b.is_none_or(|b| b.len() == rows);
    (n.checked_mul(cols) == Some(x.len()) && parts.iter().all(ok)).then_some(cols)
}

/// The outputs of parts of `rows[p]` rows each (`bytes` of weights in all) for `n` activation
/// rows: `run(p, o0, out)` writes part `p`'s outputs `o0 ..` into `out` (`[n, width]`), split
/// over the pool when the product is large ([`crate::threads::split_product`]) ([`TASKS_PER_THREAD`] runs of whole groups of rows
/// per thread, each within one part); then each part's bias is added.
pub(super) fn dispatch(
    rows: &[usize],
    biases: &[Option<&[f32]>],
    bytes: usize,
    n: usize,
    run: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<Vec<f32>> {
    let mut ys: Vec<Vec<f32>> = rows.iter().map(|&r| vec![0.0; n * r]).collect();
    if n > 0 && crate::threads::split_product(bytes, n) {
        // Rows per task: a multiple of GROUP, so every task starts on a group.
        let groups: usize = rows.iter().map(|r| r.div_ceil(GROUP)).sum();
        let tasks = rayon::current_num_threads() * TASKS_PER_THREAD;
        let per = groups.div_ceil(tasks).max(1) * GROUP;
        let runs: Vec<(usize, usize)> = (0..rows.len())
            .flat_map(|p| (0..rows[p]).step_by(per).map(move |o0| (p, o0)))
            .collect();
        let done: Vec<(usize, usize, Vec<f32>)> = runs
            .into_par_iter()
            .map(|(p, o0)| {
                let mut out = vec![0.0f32; n * per.min(rows[p] - o0)];
                run(p, o0, &mut out);
                (p, o0, out)
            })
            .collect();
        for (p, o0, out) in done {
            let width = out.len() / n;
            for r in 0..n {
                ys[p][r * rows[p] + o0..][..width]
                    .copy_from_slice(&out[r * width..(r + 1) * width]);
            }
        }
    } else if n > 0 {
        for (p, y) in ys.iter_mut().enumerate() {
            run(p, 0, y);
        }
    }
    for ((y, &rows), b) in ys.iter_mut().zip(rows).zip(biases) {
        if let Some(b) = b.filter(|_| rows > 0) {
            for row in y.chunks_exact_mut(rows) {
                for (v, bi) in row.iter_mut().zip(b) {
                    *v += bi;
                }
            }
        }
    }
    ys
}

/// The kernel a product runs: `kernel`, or the portable one where this CPU lacks it.
pub(super) fn runnable(kernel: QuantKernel) -> QuantKernel {
    if kernel.available() {
        kernel
    } else {
        QuantKernel::Portable
    }
}

/// [`super::matmul_group`] for any block format: the activations quantized once, the parts'
/// outputs in one pool dispatch, then the biases added. `None` when a part's width is not `x`'s
/// or a bias is not its part's rows long.
pub(crate) fn group_with<M: Blocks>(
    kernel: QuantKernel,
    parts: &[(&M, Option<&[f32]>)],
    x: &[f32],
    n: usize,
) -> Option<Vec<Vec<f32>>> {
    let shapes: Vec<_> = parts.iter().map(|(m, b)| (m.shape(), *b)).collect();
    let cols = fits(&shapes, x, n)?;
    let kernel = runnable(kernel);
    let q = M::acts(x, n, cols);
    let rows: Vec<usize> = parts.iter().map(|(m, _)| m.shape().0).collect();
    let biases: Vec<_> = parts.iter().map(|(_, b)| *b).collect();
    let bytes = parts.iter().map(|(m, _)| m.bytes()).sum();
    Some(dispatch(&rows, &biases, bytes, n, |p, o0, out| {
        parts[p].0.run(kernel, &q, n, o0, out);
    }))
}
