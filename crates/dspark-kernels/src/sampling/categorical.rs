//! One-pass row statistics (max, argmax, sum-exp, non-finite check) and inverse-CDF categorical
//! sampling with a single uniform.
//!
//! A row is walked in blocks of [`BLOCK`] values. For each block we keep its own max and its
//! sum of `exp((x - block_max)·s)`; the row's normalizer is the blocks' sums rescaled to the row
//! max. Sampling first walks the block sums (a few hundred numbers) and then only one block, so a
//! draw costs one pass over the row in total, with no sort and no random number per token.

use super::filter::Cut;
use crate::cpu::{MulAdd, exp, max_and_nans, multiversion512, sum_exp};
use crate::view::{BLOCK, Floats, for_each_block, for_each_block_inline};

/// Per-block statistics of a row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockSum {
    /// Largest raw value of the block (`-inf` when the block has no finite value).
    pub max: f32,
    /// `Σ exp((x - max)·s)` over the block.
    pub sum: f32,
}

/// Statistics of one row at scale `s` (`s = 1/T`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowStats {
    /// Largest raw value (NaN-ignoring; `-inf` when the row has no finite value).
    pub max: f32,
    /// Lowest index holding `max`.
    pub argmax: usize,
    /// `Σ exp((x - max)·s)` (0 when only the argmax is wanted).
    pub total: f64,
    /// Number of NaNs.
    pub nans: u32,
}

impl RowStats {
    /// `true` when the row holds NaN or `+inf`.
    pub fn non_finite(&self) -> bool {
        self.nans > 0 || self.max == f32::INFINITY
    }

    /// `true` when the row has at least one finite value.
    pub fn has_finite(&self) -> bool {
        self.max > f32::NEG_INFINITY
    }
}

#[inline(always)]
fn block_argmax(start: usize, block: &[f32], bm: f32) -> usize {
    start + block.iter().position(|&v| v == bm).unwrap_or(0)
}

/// Statistics of one block of a row, computed where the block is hot (the Markov sampler
/// computes them while it writes the block) and merged in order by [`RowMerge`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockStat {
    /// Largest raw value (NaN-ignoring; `-inf` when the block has no finite value).
    pub max: f32,
    /// Row index of the first value equal to `max`.
    pub argmax: usize,
    /// Number of NaNs.
    pub nans: u32,
    /// `Σ exp((x - max)·s)` (`0` when `max` is not finite or no sum was asked for).
    pub sum: f32,
}

impl Default for BlockStat {
    fn default() -> Self {
        BlockStat {
            max: f32::NEG_INFINITY,
            argmax: 0,
            nans: 0,
            sum: 0.0,
        }
    }
}

/// [`BlockStat`] of `block`, which starts at row index `start`; the sum at scale `s` if given.
/// The argmax is only searched when the block's max exceeds `above` (else it is `start`): pass
/// the running row max to skip blocks that cannot win, `-inf` to always search.
#[inline(always)]
pub(crate) fn block_stat<M: MulAdd>(
    start: usize,
    block: &[f32],
    s: Option<f32>,
    above: f32,
) -> BlockStat {
    let (max, nans) = max_and_nans(block);
    let sum = match s {
        Some(s) if max > f32::NEG_INFINITY && max < f32::INFINITY => sum_exp::<M>(block, max, s),
        _ => 0.0,
    };
    BlockStat {
        max,
        argmax: if max > above {
            block_argmax(start, block, max)
        } else {
            start
        },
        nans,
        sum,
    }
}

/// Merges [`BlockStat`]s, in row order, into [`RowStats`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowMerge {
    best: f32,
    argmax: usize,
    nans: u32,
}

impl RowMerge {
    /// An empty row.
    pub fn new() -> Self {
        RowMerge {
            best: f32::NEG_INFINITY,
            argmax: 0,
            nans: 0,
        }
    }

    /// Add the next block (the first maximum wins ties).
    #[inline(always)]
    pub fn push(&mut self, b: &BlockStat) {
        self.nans += b.nans;
        if b.max > self.best {
            self.best = b.max;
            self.argmax = b.argmax;
        }
    }

    /// The row's statistics; `total` sums `blocks` at scale `s` (pass `&[]` for argmax only).
    pub fn finish(&self, blocks: &[BlockSum], s: f32) -> RowStats {
        let best = self.best;
        let mut total = 0f64;
        if best > f32::NEG_INFINITY && best < f32::INFINITY {
            for b in blocks {
                if b.sum > 0.0 {
                    total += f64::from(b.sum) * (f64::from(b.max - best) * f64::from(s)).exp();
                }
            }
        }
        RowStats {
            max: best,
            argmax: self.argmax,
            total,
            nans: self.nans,
        }
    }
}

/// Max and NaN count of a row read alongside another pass (enough to validate it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Check {
    /// Largest value (NaN-ignoring; `-inf` when the row has no finite value).
    pub max: f32,
    /// Number of NaNs.
    pub nans: u32,
}

impl Check {
    /// The check of a row from its full statistics.
    pub fn of(st: &RowStats) -> Self {
        Check {
            max: st.max,
            nans: st.nans,
        }
    }

    /// `true` when the row holds NaN or `+inf`.
    pub fn non_finite(&self) -> bool {
        self.nans > 0 || self.max == f32::INFINITY
    }

    /// `true` when the row has at least one finite value.
    pub fn has_finite(&self) -> bool {
        self.max > f32::NEG_INFINITY
    }
}

/// A row validated block by block inside another pass over a row of the same length.
pub(crate) struct SideCheck<'a> {
    row: Floats<'a>,
    /// The check of the blocks stepped so far.
    pub check: Check,
    buf: [f32; BLOCK],
}

impl<'a> SideCheck<'a> {
    /// Validate `row` alongside a pass over `len` values (`None` when the lengths differ).
    pub fn new(row: Floats<'a>, len: usize) -> Option<Self> {
        (row.len() == len).then_some(SideCheck {
            row,
            check: Check {
                max: f32::NEG_INFINITY,
                nans: 0,
            },
            buf: [0f32; BLOCK],
        })
    }

    /// Fold in the values `start..start + n` (`n <= BLOCK`).
    #[inline(always)]
    pub fn step(&mut self, start: usize, n: usize) {
        let b: &[f32] = match self.row {
            Floats::F32(v) => &v[start..start + n],
            r => {
                r.read_into(start, &mut self.buf[..n]);
                &self.buf[..n]
            }
        };
        let (m, k) = max_and_nans(b);
        self.check.nans += k;
        if m > self.check.max {
            self.check.max = m;
        }
    }
}

multiversion512! {
    /// Max, argmax, NaN count and the per-block sums at scale `s` (cleared and refilled).
    pub(crate) fn row_stats<M>(row: Floats<'_>, s: f32, blocks: &mut Vec<BlockSum>) -> RowStats {
        blocks.clear();
        let mut merge = RowMerge::new();
        for_each_block_inline!(row, |start, block| {
            let st = block_stat::<M>(start, block, Some(s), merge.best);
            merge.push(&st);
            blocks.push(BlockSum { max: st.max, sum: st.sum });
        });
        merge.finish(blocks, s)
    }
}

multiversion512! {
    /// Max, argmax and NaN count only (greedy rows and validation).
    pub(crate) fn row_argmax<M>(row: Floats<'_>) -> RowStats {
        let (mut best, mut argmax, mut nans) = (f32::NEG_INFINITY, 0usize, 0u32);
        for_each_block_inline!(row, |start, block| {
            let (bm, n) = max_and_nans(block);
            nans += n;
            if bm > best {
                best = bm;
                argmax = block_argmax(start, block, bm);
            }
        });
        RowStats { max: best, argmax, total: 0.0, nans }
    }
}

/// Draw from `softmax(x·s)` of `row` using the block sums of [`row_stats`] and one uniform `u`
/// in `[0, 1)`. Returns the index of the token.
pub(crate) fn sample_blocks(
    row: Floats<'_>,
    stats: &RowStats,
    s: f32,
    blocks: &[BlockSum],
    u: f64,
) -> usize {
    let target = u * stats.total;
    let mut acc = 0f64;
    let mut last = None;
    for (i, b) in blocks.iter().enumerate() {
        if b.sum <= 0.0 {
            continue;
        }
        let scale = (f64::from(b.max - stats.max) * f64::from(s)).exp();
        let w = f64::from(b.sum) * scale;
        if w <= 0.0 {
            continue;
        }
        last = Some((i, scale));
        if acc + w > target {
            return walk_block(row, i, b.max, s, scale, target - acc);
        }
        acc += w;
    }
    // Rounding left `target` at or past the end: take the last token with positive weight.
    match last {
        Some((i, scale)) => walk_block(row, i, blocks[i].max, s, scale, f64::INFINITY),
        None => stats.argmax,
    }
}

/// Within block `i`, the first token where the running weight exceeds `target` (or the last
/// token with positive weight).
fn walk_block(row: Floats<'_>, i: usize, bm: f32, s: f32, scale: f64, target: f64) -> usize {
    let start = i * BLOCK;
    let len = BLOCK.min(row.len() - start);
    let mut buf = [0f32; BLOCK];
    row.read_into(start, &mut buf[..len]);
    let mut acc = 0f64;
    let mut last = start;
    for (j, &v) in buf[..len].iter().enumerate() {
        let w = f64::from(exp((v - bm) * s)) * scale;
        if w > 0.0 {
            last = start + j;
            acc += w;
            if acc > target {
                return start + j;
            }
        }
    }
    last
}

/// Draw from `softmax(x·s)` restricted to the tokens a [`Cut`] keeps, whose total weight
/// (relative to `max`) is `total`. One pass over the row.
pub(crate) fn sample_cut(
    row: Floats<'_>,
    max: f32,
    s: f32,
    cut: &Cut,
    total: f64,
    u: f64,
    fallback: usize,
) -> usize {
    let target = u * total;
    let mut acc = 0f64;
    let mut last = None;
    let mut found = None;
    for_each_block(row, |start, block| {
        if found.is_some() {
            return;
        }
        for (j, &v) in block.iter().enumerate() {
            if !cut.keeps(v, start + j) {
                continue;
            }
            let w = f64::from(exp((v - max) * s));
            if w > 0.0 {
                last = Some(start + j);
                acc += w;
                if acc > target {
                    found = Some(start + j);
                    return;
                }
            }
        }
    });
    found.or(last).unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 613) as f32) / 97.0 - 3.0)
            .collect()
    }

    #[test]
    fn stats_match_a_direct_computation() {
        let x = row(1000);
        let mut blocks = Vec::new();
        let st = row_stats(Floats::F32(&x), 0.7, &mut blocks);
        let m = x.iter().cloned().fold(f32::MIN, f32::max);
        assert_eq!(st.max, m);
        assert_eq!(st.argmax, x.iter().position(|&v| v == m).unwrap());
        let want: f64 = x.iter().map(|&v| (f64::from(v - m) * 0.7).exp()).sum();
        assert!((st.total - want).abs() / want < 1e-5);
        assert_eq!(blocks.len(), 4);
        let bf: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let sb = row_stats(Floats::BF16(&bf), 0.7, &mut blocks);
        assert_eq!(sb.max, half::bf16::from_f32(m).to_f32());
    }

    #[test]
    fn argmax_takes_the_lowest_index_and_flags_non_finite() {
        let mut x = vec![0f32; 600];
        x[300] = 5.0;
        x[500] = 5.0;
        assert_eq!(row_argmax(Floats::F32(&x)).argmax, 300);
        x[10] = f32::NAN;
        assert!(row_argmax(Floats::F32(&x)).non_finite());
        x[10] = f32::INFINITY;
        assert!(row_argmax(Floats::F32(&x)).non_finite());
        x[10] = f32::NEG_INFINITY;
        assert!(!row_argmax(Floats::F32(&x)).non_finite());
    }

    #[test]
    fn inverse_cdf_hits_the_right_tokens() {
        // Weights 1,2,3,... over 700 tokens; u at exact cumulative boundaries.
        let x: Vec<f32> = (0..700).map(|i| ((i + 1) as f32).ln()).collect();
        let mut blocks = Vec::new();
        let st = row_stats(Floats::F32(&x), 1.0, &mut blocks);
        let total: f64 = (1..=700).map(f64::from).sum();
        for &k in &[0usize, 1, 255, 256, 257, 511, 699] {
            let before: f64 = (1..=k).map(|i| i as f64).sum();
            let u = (before + 0.5) / total;
            assert_eq!(sample_blocks(Floats::F32(&x), &st, 1.0, &blocks, u), k);
            let cut = Cut {
                value: f32::NEG_INFINITY,
                id: usize::MAX,
            };
            let got = sample_cut(Floats::F32(&x), st.max, 1.0, &cut, st.total, u, 0);
            assert_eq!(got, k);
        }
        assert_eq!(
            sample_blocks(Floats::F32(&x), &st, 1.0, &blocks, 0.999_999_999_9),
            699
        );
    }
}
