//! The host Markov block sampler: per slot, `W2` read once for the whole batch (the dot kernel
//! of `cpu/dots.rs`, split over column blocks), each column block biased straight into its
//! destination with its statistics taken while hot.

use rayon::prelude::*;

use super::{DraftBlock, Geometry, HostInputs};
use crate::cpu::par::{for_each_chunk_init, map_chunks_mut, map_range, worth_parallel};
use crate::cpu::{Unfused, bias_block, dot};
use crate::error::Result;
use crate::idmap::IdMap;
use crate::sampling::categorical::{
    BlockStat, BlockSum, RowMerge, RowStats, block_stat, row_argmax, sample_blocks,
};
use crate::sampling::dist::{Scope, check_row};
use crate::sampling::filter::top_k_members;
use crate::sampling::rng::{Stream, Tag};
use crate::view::{BLOCK, Floats, Mat, Rows3};

/// The host slice sampler over validated inputs (`g`, one stream per request).
pub(super) fn run(g: &Geometry, streams: &[Stream], x: &HostInputs<'_>) -> Result<DraftBlock> {
    let (base, w1, w2, opts) = (x.base, x.w1, x.w2, x.opts);
    let (b_n, k_n, vt, r) = (g.batch, g.slots, g.target_vocab, g.rank);
    if b_n == 0 || k_n == 0 {
        return Ok(DraftBlock::new(g, Vec::new(), Vec::new(), Vec::new()));
    }
    // T == 0, or so small that scale/T overflows: the distribution is the argmax.
    let (greedy, mult) = opts.draft_mult();
    let candidates = match opts.top_k.filter(|&k| k < g.valid) {
        Some(k) => Some(top_k_candidates(&base, g, k)?),
        None => None,
    };
    // The dense path writes every entry of every row (a zeroed allocation is mapped lazily, so
    // the rows are first touched by the parallel kernel); the top-k path writes only candidates.
    let fill = if candidates.is_some() {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    let mut out = DraftBlock::new(
        g,
        vec![0; b_n * k_n],
        vec![fill; b_n * k_n * vt],
        vec![0.0; b_n * k_n * r],
    );
    let mut dense = Dense {
        stats: Vec::new(),
        lrows: Vec::new(),
    };
    if candidates.is_none() {
        dense.stats = vec![BlockStat::default(); g.valid.div_ceil(BLOCK) * b_n];
        if opts.id_map.table().is_some() && !greedy {
            dense.lrows = vec![0f32; b_n * g.valid];
        }
    }
    // Per slot: every request's valid row, biased (`r` multiply-adds) and scanned.
    let par = worth_parallel(b_n * g.valid * (r + 16));
    let mut prev: Vec<u32> = x.anchors.to_vec();
    let mut e = vec![0f32; b_n * r];
    for k in 0..k_n {
        for b in 0..b_n {
            let eb = &mut e[b * r..(b + 1) * r];
            w1.row(prev[b] as usize).read_into(0, eb);
            out.prev_embeddings[(b * k_n + k) * r..(b * k_n + k + 1) * r].copy_from_slice(eb);
        }
        let ctx = SlotCtx {
            g,
            k,
            greedy,
            mult,
            streams,
            id_map: opts.id_map,
            par,
        };
        let picks: Vec<u32> = match &candidates {
            Some(c) => ctx.slot_top_k(&base, &w2, &e, c, &mut out.draft_logits)?,
            None => ctx.slot_dense(&base, w2, &e, &mut dense, &mut out.draft_logits)?,
        };
        for (b, &t) in picks.iter().enumerate() {
            out.tokens[b * k_n + k] = t;
            prev[b] = t;
        }
    }
    Ok(out)
}

/// Buffers of the dense path, reused across slots.
struct Dense {
    /// `[block][B]` statistics of the current slot.
    stats: Vec<BlockStat>,
    /// `[B][valid]` draft-space rows (sampling with an id table only).
    lrows: Vec<f32>,
}

/// Per-slot context shared by the dense and top-k paths.
struct SlotCtx<'a> {
    g: &'a Geometry,
    k: usize,
    greedy: bool,
    mult: f32,
    streams: &'a [Stream],
    id_map: &'a IdMap,
    /// Whether this slot's work is worth the thread pool (see `par`).
    par: bool,
}

impl SlotCtx<'_> {
    fn where_(&self, b: usize) -> String {
        format!("draft logits (request {b}, slot {})", self.k)
    }

    fn map(&self, d: usize) -> u32 {
        // `d < valid`, so the map always has a target (validated up front).
        self.id_map.to_target(d).unwrap_or(0)
    }

    /// Dense path: per column block of [`BLOCK`] draft ids (in parallel), read the base logits of
    /// every request, add the bias (`W2` read once per slot), and take the block statistics
    /// while the block is hot; then per request, merge the statistics and pick. Greedy rows
    /// are biased in a small scratch (only the argmax is kept); sampled rows are biased in
    /// place in `draft_logits` (identity map) or in `dense.lrows` (then scattered by the map).
    fn slot_dense(
        &self,
        base: &Rows3<'_>,
        w2: Mat<'_>,
        e: &[f32],
        dense: &mut Dense,
        draft_logits: &mut [f32],
    ) -> Result<Vec<u32>> {
        let (b_n, k_n, vt, valid) = (
            self.g.batch,
            self.g.slots,
            self.g.target_vocab,
            self.g.valid,
        );
        let (k, mult) = (self.k, self.mult);
        let nblk = valid.div_ceil(BLOCK);
        let table = self.id_map.table();
        let scale = (!self.greedy).then_some(1.0);
        let fill = |jb: usize, dst: &mut [&mut [f32]], st: &mut [BlockStat]| {
            let d0 = jb * BLOCK;
            for (b, seg) in dst.iter_mut().enumerate() {
                base.row(b, k).sub(d0, seg.len()).read_into(0, seg);
            }
            bias_block(w2, d0, e, dst, mult);
            for (seg, o) in dst.iter().zip(st.iter_mut()) {
                *o = block_stat::<Unfused>(d0, seg, scale, f32::NEG_INFINITY);
            }
        };
        let stats = &mut dense.stats[..nblk * b_n];
        if self.greedy {
            for_each_chunk_init(
                self.par,
                stats,
                b_n,
                || vec![0f32; b_n * BLOCK],
                |buf, jb, st| {
                    let len = BLOCK.min(valid - jb * BLOCK);
                    let mut dst: Vec<&mut [f32]> =
                        buf.chunks_mut(BLOCK).map(|c| &mut c[..len]).collect();
                    fill(jb, &mut dst, st);
                },
            );
        } else {
            let rows: Vec<&mut [f32]> = match table {
                None => draft_logits
                    .chunks_mut(k_n * vt)
                    .map(|x| &mut x[k * vt..k * vt + valid])
                    .collect(),
                Some(_) => dense.lrows.chunks_mut(valid).collect(),
            };
            // Segments in `[block][request]` order.
            let mut iters: Vec<_> = rows.into_iter().map(|x| x.chunks_mut(BLOCK)).collect();
            let mut segs: Vec<&mut [f32]> = Vec::with_capacity(nblk * b_n);
            for _ in 0..nblk {
                segs.extend(iters.iter_mut().filter_map(Iterator::next));
            }
            if self.par {
                segs.par_chunks_mut(b_n)
                    .zip(stats.par_chunks_mut(b_n))
                    .enumerate()
                    .for_each(|(jb, (dst, st))| fill(jb, dst, st));
            } else {
                for (jb, (dst, st)) in segs.chunks_mut(b_n).zip(stats.chunks_mut(b_n)).enumerate() {
                    fill(jb, dst, st);
                }
            }
        }
        let (stats, lrows) = (&dense.stats[..nblk * b_n], &dense.lrows);
        map_chunks_mut(self.par, draft_logits, k_n * vt, |b, rows| {
            let orow = &mut rows[k * vt..(k + 1) * vt];
            let mut merge = RowMerge::new();
            let mut blocks = Vec::with_capacity(if self.greedy { 0 } else { nblk });
            for st in stats.iter().skip(b).step_by(b_n) {
                merge.push(st);
                if !self.greedy {
                    blocks.push(BlockSum {
                        max: st.max,
                        sum: st.sum,
                    });
                }
            }
            let st = merge.finish(&blocks, 1.0);
            self.check_row(b, &st)?;
            if self.greedy {
                let d = st.argmax;
                orow.fill(f32::NEG_INFINITY);
                orow[table.map_or(d, |t| t[d] as usize)] = 0.0;
                return Ok(self.map(d));
            }
            let u = self.streams[b].uniform(Tag::Draft, k as u64, 0);
            let d = match table {
                None => {
                    let d = sample_blocks(Floats::F32(&orow[..valid]), &st, 1.0, &blocks, u);
                    orow[valid..].fill(f32::NEG_INFINITY);
                    d
                }
                Some(t) => {
                    let lrow = &lrows[b * valid..(b + 1) * valid];
                    let d = sample_blocks(Floats::F32(lrow), &st, 1.0, &blocks, u);
                    orow.fill(f32::NEG_INFINITY);
                    for (di, &l) in lrow.iter().enumerate() {
                        orow[t[di] as usize] = l;
                    }
                    d
                }
            };
            Ok(self.map(d))
        })
    }

    /// The row checks: no NaN or `+inf`, at least one finite value.
    fn check_row(&self, b: usize, st: &RowStats) -> Result<()> {
        let (nan, empty) = (st.non_finite(), !st.has_finite());
        check_row("base_logits", nan, empty, Scope::Vocabulary, || {
            self.where_(b)
        })
    }

    /// Top-k path: only the candidates get the bias.
    fn slot_top_k(
        &self,
        base: &Rows3<'_>,
        w2: &Mat<'_>,
        e: &[f32],
        cands: &[Vec<usize>],
        draft_logits: &mut [f32],
    ) -> Result<Vec<u32>> {
        let (k_n, vt, r) = (self.g.slots, self.g.target_vocab, self.g.rank);
        map_chunks_mut(self.par, draft_logits, k_n * vt, |b, rows| {
            let orow = &mut rows[self.k * vt..(self.k + 1) * vt];
            let ids = &cands[b * k_n + self.k];
            let brow = base.row(b, self.k);
            let eb = &e[b * r..(b + 1) * r];
            let mut w = vec![0f32; r];
            let mut l = Vec::with_capacity(ids.len());
            for &d in ids {
                w2.row(d).read_into(0, &mut w);
                l.push(self.mult * (brow.get(d) + dot(&w, eb)));
            }
            let st = row_argmax(Floats::F32(&l));
            // The same checks (and codes) as the dense path: a biased candidate row with no
            // finite entry is refused, never sampled from.
            self.check_row(b, &st)?;
            let j = if self.greedy {
                st.argmax
            } else {
                let u = self.streams[b].uniform(Tag::Draft, self.k as u64, 0);
                pick(&l, st.max, u).unwrap_or(st.argmax)
            };
            for (i, &d) in ids.iter().enumerate() {
                let t = self.map(d) as usize;
                orow[t] = if self.greedy {
                    if i == j { 0.0 } else { f32::NEG_INFINITY }
                } else {
                    l[i]
                };
            }
            Ok(self.map(ids[j]))
        })
    }
}

/// Inverse-CDF draw among a few logits (exact `f64` weights).
fn pick(l: &[f32], max: f32, u: f64) -> Option<usize> {
    let w: Vec<f64> = l
        .iter()
        .map(|&x| (f64::from(x) - f64::from(max)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let target = u * total;
    let mut acc = 0.0;
    let mut last = None;
    for (i, &wi) in w.iter().enumerate() {
        if wi > 0.0 {
            last = Some(i);
            acc += wi;
            if acc > target {
                return Some(i);
            }
        }
    }
    last
}

/// Base top-k candidates of every `(b, k)` row over the valid columns, in id order.
fn top_k_candidates(base: &Rows3<'_>, g: &Geometry, top_k: usize) -> Result<Vec<Vec<usize>>> {
    let par = worth_parallel(g.batch * g.slots * g.valid);
    map_range(par, g.batch * g.slots, |i| {
        let (b, k) = (i / g.slots, i % g.slots);
        let row = base.row(b, k).sub(0, g.valid);
        let st = row_argmax(row);
        let where_ = || format!("base logits (request {b}, slot {k})");
        let (nan, empty) = (st.non_finite(), !st.has_finite());
        check_row("base_logits", nan, empty, Scope::Vocabulary, where_)?;
        let mut ids: Vec<usize> = top_k_members(row, top_k)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        ids.sort_unstable();
        Ok(ids)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{Fused, dots_portable};
    use crate::sampling::markov::{BlockOptions, sample_block_slices_on};
    use crate::view::Seeds;

    fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        let grid = crate::test_values::grid(n, seed, 20_011, 20_011.0, 0.5);
        grid.into_iter().map(|v| scale * v).collect()
    }

    /// `mult·(base + W2[d]·e)` in the kernel's exact accumulation order (fused multiply-add
    /// where the CPU has AVX2+FMA, as the dispatched kernel).
    fn exact_row(base: &[f32], w2: &[f32], e: &[f32], r: usize, mult: f32) -> Vec<f32> {
        base.iter()
            .enumerate()
            .map(|(d, &x)| {
                let mut o = [0f32; 1];
                let w = &w2[d * r..(d + 1) * r];
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::has_avx2() {
                    dots_portable::<Fused, 1>(w, e, &mut o);
                    return mult * (x + o[0]);
                }
                dots_portable::<Unfused, 1>(w, e, &mut o);
                mult * (x + o[0])
            })
            .collect()
    }

    #[test]
    fn dense_rows_are_bit_exact_on_odd_shapes() {
        // V_d = 700 (not a multiple of the block), r with and without a tail, B = 1, 3, 8, 9
        // (every register tile), identity and table maps, greedy and sampled.
        let (vd, k_n) = (700usize, 3usize);
        for (b_n, r, table) in [(1, 37, false), (3, 8, true), (8, 256, false), (9, 37, true)] {
            let vt = if table { 1000 } else { vd };
            let map = if table {
                let offsets: Vec<i64> = (0..vd as i64).map(|d| d * 7 % 1000 - d).collect();
                IdMap::from_offsets(&offsets, vd, vt).unwrap()
            } else {
                IdMap::identity(vt).unwrap()
            };
            let base = values(b_n * k_n * vd, 1, 6.0);
            let (w1, w2) = (values(vt * r, 2, 1.0), values(vd * r, 3, 1.0));
            let anchors: Vec<u32> = (0..b_n as u32).map(|b| b * 97 % vt as u32).collect();
            for t in [0.0f32, 0.8] {
                let opts = BlockOptions {
                    temperature: t,
                    seeds: Seeds::Scalar(9),
                    id_map: &map,
                    top_k: None,
                    logit_scale: 1.25,
                };
                // The fast kernel's exact accumulation order (whatever the kernel path switch says).
                let out = sample_block_slices_on(
                    None,
                    Rows3::new(Floats::F32(&base), [b_n, k_n, vd]).unwrap(),
                    Mat::new(Floats::F32(&w1), [vt, r]).unwrap(),
                    Mat::new(Floats::F32(&w2), [vd, r]).unwrap(),
                    &anchors,
                    &opts,
                )
                .unwrap();
                let mult = if t == 0.0 { 1.25 } else { 1.25 / t };
                for (b, &anchor) in anchors.iter().enumerate() {
                    let mut prev = anchor as usize;
                    for k in 0..k_n {
                        let e = &w1[prev * r..(prev + 1) * r];
                        let i = b * k_n + k;
                        let want = exact_row(&base[i * vd..(i + 1) * vd], &w2, e, r, mult);
                        let row = &out.draft_logits[i * vt..(i + 1) * vt];
                        let tok = out.tokens[i] as usize;
                        let target = |d: usize| map.to_target(d).unwrap() as usize;
                        if t == 0.0 {
                            let d = (0..vd).fold(0, |m, d| if want[d] > want[m] { d } else { m });
                            assert_eq!(tok, target(d), "B {b_n} r {r} b {b} k {k}");
                            let hot = row.iter().filter(|&&v| v == 0.0).count();
                            assert_eq!((hot, row[tok]), (1, 0.0));
                        } else {
                            let mut mapped = vec![f32::NEG_INFINITY; vt];
                            for (d, &v) in want.iter().enumerate() {
                                mapped[target(d)] = v;
                            }
                            let same = row
                                .iter()
                                .zip(&mapped)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "B {b_n} r {r} table {table} b {b} k {k}");
                            assert!(row[tok].is_finite());
                        }
                        prev = tok;
                    }
                }
            }
        }
    }
}
