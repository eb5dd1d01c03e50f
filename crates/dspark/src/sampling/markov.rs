//! The sequential Markov block sampler.
//!
//! Slot `k`: `logits = scale·(base_k + W2·W1[x_{k-1}])` in draft space (`x_0` = anchor, `W1`
//! indexed by the previous token's TARGET id), padded columns `[V_t, V_d)` masked, then greedy
//! argmax (`T = 0`, ties → lowest id) or one inverse-CDF draw at temperature `T`; the draft id is
//! mapped to a target id and the next slot conditions on it. The exact distribution of each slot
//! is recorded in target space.
//!
//! Cost: per slot, `W2` is read once for the whole batch (a `[V_d, r] × [r, B]` product split over
//! column blocks across threads), then each row is walked once.

use super::categorical::{BlockSum, row_argmax, row_stats, sample_blocks};
use super::dist::non_finite;
use super::fastmath::{dot, multiversion};
use super::filter::{Goal, find_cut};
use super::rng::{Stream, Tag};
use super::view::{BLOCK, Floats, Mat, Rows3, Seeds};
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use rayon::prelude::*;

/// Options of [`sample_block_slices`].
#[derive(Debug, Clone)]
pub struct BlockOptions<'a> {
    /// Draft temperature; `0` = greedy. Finite and `>= 0`.
    pub temperature: f32,
    /// Random seeds (see [`Seeds`]).
    pub seeds: Seeds,
    /// The drafter's draft-to-target id map (`target_vocab()` is `V_t`).
    pub id_map: &'a IdMap,
    /// Top-k candidate walk: only the base top-k of each slot get the Markov bias, every other
    /// column is `-inf` (`None` = dense; `Some(0)` is an error).
    pub top_k: Option<usize>,
    /// Multiplies base logits and bias (`1.0` when the model has none). Finite and `> 0`.
    pub logit_scale: f32,
}

/// A drafted block.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftBlock {
    /// `B`.
    pub batch: usize,
    /// `K`.
    pub slots: usize,
    /// `V_t`.
    pub target_vocab: usize,
    /// Markov rank `r`.
    pub rank: usize,
    /// `[B·K]` drafted TARGET ids.
    pub tokens: Vec<u32>,
    /// `[B·K·V_t]`: `softmax(row)` is exactly the distribution slot `k` was drawn from (after bias,
    /// mask, temperature, top-k); `-inf` outside the draft's support; at `T = 0`, `0.0` at the
    /// argmax and `-inf` elsewhere.
    pub draft_logits: Vec<f32>,
    /// `[B·K·r]`: `W1[x_{k-1}]` in f32 (`x_0` = anchor), for the confidence head.
    pub prev_embeddings: Vec<f32>,
}

/// Validated geometry.
struct Geometry {
    batch: usize,
    slots: usize,
    /// `V_t`.
    target_vocab: usize,
    /// Draft columns that may be sampled: `[0, valid)`.
    valid: usize,
    rank: usize,
}

fn validate(
    base: &Rows3<'_>,
    w1: &Mat<'_>,
    w2: &Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<Geometry> {
    base.check("base_logits")?;
    w1.check("markov_w1")?;
    w2.check("markov_w2")?;
    let [batch, slots, draft_vocab] = base.dims;
    let [input_vocab, rank] = w1.dims;
    if w2.dims[0] != draft_vocab {
        return Err(Error::bad_shape(
            "markov_w2",
            format!(
                "{} rows, but base logits have V_d = {draft_vocab} columns",
                w2.dims[0]
            ),
        ));
    }
    if w2.dims[1] != rank {
        return Err(Error::bad_shape(
            "markov_w2",
            format!("rank {} differs from markov_w1 rank {rank}", w2.dims[1]),
        ));
    }
    if anchors.len() != batch {
        return Err(Error::bad_shape(
            "anchors",
            format!("{} anchors for a batch of {batch}", anchors.len()),
        ));
    }
    if let Some(&a) = anchors.iter().find(|&&a| a as usize >= input_vocab) {
        return Err(Error::TokenOutOfRange {
            name: "anchors".into(),
            id: i64::from(a),
            vocab_size: input_vocab,
        });
    }
    let t = opts.temperature;
    if !(t.is_finite() && t >= 0.0) {
        return Err(Error::invalid(
            "temperature",
            format!("{t} (must be finite and >= 0)"),
        ));
    }
    let s = opts.logit_scale;
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::invalid(
            "logit_scale",
            format!("{s} (must be finite and > 0)"),
        ));
    }
    if opts.top_k == Some(0) {
        return Err(Error::invalid("top_k", "0 (use None for the dense path)"));
    }
    let target_vocab = opts.id_map.target_vocab();
    let (valid, max_target) = match opts.id_map.table() {
        None => {
            if draft_vocab < target_vocab {
                return Err(Error::invalid(
                    "id_map",
                    format!(
                        "identity map but draft vocab V_d = {draft_vocab} < target vocab \
                         V_t = {target_vocab}: a reduced vocabulary needs its d2t table"
                    ),
                ));
            }
            (target_vocab, target_vocab.checked_sub(1))
        }
        Some(table) => {
            if table.len() != draft_vocab {
                return Err(Error::invalid(
                    "id_map",
                    format!(
                        "d2t table has {} entries but base logits have V_d = {draft_vocab} columns",
                        table.len()
                    ),
                ));
            }
            (draft_vocab, table.iter().max().map(|&m| m as usize))
        }
    };
    if valid == 0 {
        return Err(Error::invalid(
            "id_map",
            "no draft column maps to a target id",
        ));
    }
    if let Some(m) = max_target.filter(|&m| m >= input_vocab) {
        return Err(Error::bad_shape(
            "markov_w1",
            format!("{input_vocab} rows, but the drafter can emit target id {m}"),
        ));
    }
    Ok(Geometry {
        batch,
        slots,
        target_vocab,
        valid,
        rank,
    })
}

multiversion! {
    /// `z[b][i] = mult·(z[b][i] + W2[cols.start+i]·e_b)` for one column block (`z` holds the
    /// base logits on entry, laid out `[batch][stride]`).
    fn bias_block(
        w2: Mat<'_>,
        cols: std::ops::Range<usize>,
        e: &[f32],
        batch: usize,
        mult: f32,
        z: &mut [f32],
        stride: usize,
    ) {
        let r = w2.dims[1];
        let (d0, len) = (cols.start, cols.len());
        let mut wbuf = vec![0f32; if matches!(w2.data, Floats::F32(_)) { 0 } else { r }];
        for i in 0..len {
            let w: &[f32] = match w2.data {
                Floats::F32(s) => &s[(d0 + i) * r..(d0 + i + 1) * r],
                other => {
                    other.read_into((d0 + i) * r, &mut wbuf);
                    &wbuf
                }
            };
            for b in 0..batch {
                let zi = &mut z[b * stride + i];
                *zi = mult * (*zi + dot(w, &e[b * r..(b + 1) * r]));
            }
        }
    }
}

/// Draw a block of `K` tokens per request.
///
/// `base` is `[B, K, V_d]`, `w1` is `[V_in, r]` (rows indexed by target id), `w2` is `[V_d, r]`,
/// `anchors` holds `B` target ids `< V_in`.
pub fn sample_block_slices(
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let g = validate(&base, &w1, &w2, anchors, opts)?;
    let streams = opts.seeds.streams(g.batch, "seeds")?;
    let (b_n, k_n, vt, r) = (g.batch, g.slots, g.target_vocab, g.rank);
    if b_n == 0 || k_n == 0 {
        return Ok(DraftBlock {
            batch: b_n,
            slots: k_n,
            target_vocab: vt,
            rank: r,
            tokens: Vec::new(),
            draft_logits: Vec::new(),
            prev_embeddings: Vec::new(),
        });
    }
    let greedy = opts.temperature == 0.0;
    let mult = if greedy {
        opts.logit_scale
    } else {
        opts.logit_scale / opts.temperature
    };
    let mut out = DraftBlock {
        batch: b_n,
        slots: k_n,
        target_vocab: vt,
        rank: r,
        tokens: vec![0; b_n * k_n],
        draft_logits: vec![f32::NEG_INFINITY; b_n * k_n * vt],
        prev_embeddings: vec![0.0; b_n * k_n * r],
    };
    let candidates = match opts.top_k.filter(|&k| k < g.valid) {
        Some(k) => Some(top_k_candidates(&base, &g, k)?),
        None => None,
    };
    // Dense scratch: `[column block][B][cb]`, one segment of `cb` values per (block, request).
    let cb = g.valid.min(BLOCK);
    let nblk = g.valid.div_ceil(cb);
    let mut z = if candidates.is_some() {
        Vec::new()
    } else {
        vec![0f32; nblk * b_n * cb]
    };
    // Segments per parallel task: a whole column block (W2 read once per slot) when there are
    // enough blocks to share out, else fewer requests per task (small vocabularies).
    let tasks = 4 * rayon::current_num_threads();
    let group = if nblk >= tasks {
        b_n
    } else {
        (nblk * b_n).div_ceil(tasks).max(1)
    };
    let mut prev: Vec<u32> = anchors.to_vec();
    let mut e = vec![0f32; b_n * r];
    for k in 0..k_n {
        for b in 0..b_n {
            let eb = &mut e[b * r..(b + 1) * r];
            w1.row(prev[b] as usize).read_into(0, eb);
            out.prev_embeddings[(b * k_n + k) * r..(b * k_n + k + 1) * r].copy_from_slice(eb);
        }
        let ctx = SlotCtx {
            g: &g,
            k,
            greedy,
            mult,
            streams: &streams,
            id_map: opts.id_map,
        };
        let picks: Vec<u32> = match &candidates {
            Some(c) => ctx.slot_top_k(&base, &w2, &e, c, &mut out.draft_logits)?,
            None => {
                z.par_chunks_mut(cb * group)
                    .enumerate()
                    .for_each(|(c, zc)| {
                        let first = c * group;
                        let segs = zc.len() / cb;
                        let mut s0 = 0;
                        // Runs of segments that share a column block.
                        while s0 < segs {
                            let (jb, b0) = ((first + s0) / b_n, (first + s0) % b_n);
                            let nb = (b_n - b0).min(segs - s0);
                            let (d0, len) = (jb * cb, cb.min(g.valid - jb * cb));
                            let zr = &mut zc[s0 * cb..(s0 + nb) * cb];
                            for (i, seg) in zr.chunks_mut(cb).enumerate() {
                                base.row(b0 + i, k)
                                    .sub(d0, len)
                                    .read_into(0, &mut seg[..len]);
                            }
                            bias_block(
                                w2,
                                d0..d0 + len,
                                &e[b0 * r..(b0 + nb) * r],
                                nb,
                                mult,
                                zr,
                                cb,
                            );
                            s0 += nb;
                        }
                    });
                ctx.slot_dense(&z, &mut out.draft_logits)?
            }
        };
        for (b, &t) in picks.iter().enumerate() {
            out.tokens[b * k_n + k] = t;
            prev[b] = t;
        }
    }
    Ok(out)
}

/// Per-slot context shared by the dense and top-k paths.
struct SlotCtx<'a> {
    g: &'a Geometry,
    k: usize,
    greedy: bool,
    mult: f32,
    streams: &'a [Stream],
    id_map: &'a IdMap,
}

impl SlotCtx<'_> {
    fn where_(&self, b: usize) -> String {
        format!("draft logits (request {b}, slot {})", self.k)
    }

    fn map(&self, d: usize) -> u32 {
        // `d < valid`, so the map always has a target (validated up front).
        self.id_map.to_target(d).unwrap_or(0)
    }

    /// Dense path: `z` holds the final logits in `[block][B][BLOCK]` layout.
    fn slot_dense(&self, z: &[f32], draft_logits: &mut [f32]) -> Result<Vec<u32>> {
        let (b_n, k_n, vt, valid) = (
            self.g.batch,
            self.g.slots,
            self.g.target_vocab,
            self.g.valid,
        );
        let table = self.id_map.table();
        draft_logits
            .par_chunks_mut(k_n * vt)
            .enumerate()
            .map(|(b, rows)| {
                let orow = &mut rows[self.k * vt..(self.k + 1) * vt];
                // Gather this request's logits contiguously in draft space.
                let cb = valid.min(BLOCK);
                let gather = |lrow: &mut [f32]| {
                    for (jb, chunk) in lrow.chunks_mut(cb).enumerate() {
                        let src = (jb * b_n + b) * cb;
                        chunk.copy_from_slice(&z[src..src + chunk.len()]);
                    }
                };
                let d = match table {
                    None => {
                        gather(&mut orow[..valid]);
                        let d = self.pick_row(b, &orow[..valid])?;
                        if self.greedy {
                            orow.fill(f32::NEG_INFINITY);
                            orow[d] = 0.0;
                        }
                        d
                    }
                    Some(t) => {
                        let mut lrow = vec![0f32; valid];
                        gather(&mut lrow);
                        let d = self.pick_row(b, &lrow)?;
                        if self.greedy {
                            orow[t[d] as usize] = 0.0;
                        } else {
                            for (di, &l) in lrow.iter().enumerate() {
                                orow[t[di] as usize] = l;
                            }
                        }
                        d
                    }
                };
                Ok(self.map(d))
            })
            .collect()
    }

    /// Greedy argmax or one draw from `softmax(lrow)`, with the row checks.
    fn pick_row(&self, b: usize, lrow: &[f32]) -> Result<usize> {
        let mut blocks: Vec<BlockSum> = Vec::new();
        let st = if self.greedy {
            row_argmax(Floats::F32(lrow))
        } else {
            row_stats(Floats::F32(lrow), 1.0, &mut blocks)
        };
        if st.non_finite() {
            return Err(non_finite(
                "base_logits",
                format!("NaN or +inf in {}", self.where_(b)),
            ));
        }
        if !st.has_finite() {
            return Err(Error::invalid(
                "base_logits",
                format!(
                    "{} has no finite entry in the valid vocabulary",
                    self.where_(b)
                ),
            ));
        }
        Ok(if self.greedy {
            st.argmax
        } else {
            let u = self.streams[b].uniform(Tag::Draft, self.k as u64, 0);
            sample_blocks(Floats::F32(lrow), &st, 1.0, &blocks, u)
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
        draft_logits
            .par_chunks_mut(k_n * vt)
            .enumerate()
            .map(|(b, rows)| {
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
                if st.non_finite() {
                    return Err(non_finite(
                        "base_logits",
                        format!("NaN or +inf in {}", self.where_(b)),
                    ));
                }
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
            .collect()
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
    (0..g.batch * g.slots)
        .into_par_iter()
        .map(|i| {
            let (b, k) = (i / g.slots, i % g.slots);
            let row = base.row(b, k).sub(0, g.valid);
            let st = row_argmax(row);
            let where_ = || format!("base logits (request {b}, slot {k})");
            if st.non_finite() {
                return Err(non_finite(
                    "base_logits",
                    format!("NaN or +inf in {}", where_()),
                ));
            }
            if !st.has_finite() {
                return Err(Error::invalid(
                    "base_logits",
                    format!("{} has no finite entry in the valid vocabulary", where_()),
                ));
            }
            let cut = find_cut(row, st.max, 1.0, None, Goal::Count(top_k)).cut;
            let mut ids = Vec::with_capacity(top_k);
            super::view::for_each_block(row, |start, blk| {
                for (j, &v) in blk.iter().enumerate() {
                    if v > f32::NEG_INFINITY && cut.is_none_or(|c| c.keeps(v, start + j)) {
                        ids.push(start + j);
                    }
                }
            });
            Ok(ids)
        })
        .collect()
}
