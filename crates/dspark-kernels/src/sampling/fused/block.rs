//! The Rust model of `kernels/fused_block.cu`: the block sampler's launches in their order and
//! arithmetic (the bias as sequential fused multiply-adds over the rank, fixed-order block
//! statistics, the draw by chunks, 4-column segments and columns). It is the fused sampler's
//! `cpu_fwd`; [`decode`] turns its status words into the fast path's first error.

use super::exec::BlockSettings;
use super::layout::{SB_CHUNK, SB_CPT, THREADS, VfChunk, sb_chunks, sb_status};
use super::math::{
    Goal, KeyCut, chunk_stats, exp, finite, merge_chunks, radix, validity, walk_parts,
};
use crate::error::{Error, Result};
use crate::sampling::dist::{Scope, nan_in, no_finite};
use crate::sampling::rng::{Stream, Tag, combine};
use crate::view::{Mat, Rows3};

/// A block-sampler call as the kernels see it.
pub(crate) struct Call<'a> {
    /// `[B, K, V_d]`.
    pub base: Rows3<'a>,
    /// `[V_in, r]`.
    pub w1: Mat<'a>,
    /// `[V_d, r]`.
    pub w2: Mat<'a>,
    /// `B` target ids.
    pub anchors: &'a [u32],
    /// `B` stream keys.
    pub streams: &'a [u64],
    /// Target id of each draft id (`None`: identity).
    pub table: Option<&'a [u32]>,
    /// `V_t`.
    pub vocab_t: usize,
    /// Draft columns that may be drawn.
    pub valid: usize,
    /// Whether the draft is greedy.
    pub greedy: bool,
    /// `logit_scale` (over the temperature when sampling).
    pub mult: f32,
    /// Top-k candidates (`None`: dense).
    pub top_k: Option<usize>,
}

/// What the launches leave behind.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Output {
    /// `[B, K]` target ids.
    pub tokens: Vec<u32>,
    /// `[B, K]` [`sb_status`] words.
    pub status: Vec<u32>,
    /// `[B]` witness hashes.
    pub witness: Vec<u64>,
    /// `[B, K, V_t]` draft logits.
    pub out: Vec<f32>,
    /// `[B, K, r]` embeddings.
    pub emb: Vec<f32>,
}

impl<'a> Call<'a> {
    /// A call over these matrices with the settings `set` and the id table `table`.
    pub(crate) fn new(
        base: Rows3<'a>,
        w1: Mat<'a>,
        w2: Mat<'a>,
        set: &BlockSettings<'a>,
        table: Option<&'a [u32]>,
    ) -> Self {
        Call {
            base,
            w1,
            w2,
            anchors: set.anchors,
            streams: set.streams,
            table,
            vocab_t: set.target_vocab,
            valid: set.valid,
            greedy: set.greedy,
            mult: set.mult,
            top_k: set.top_k,
        }
    }

    fn map(&self, d: usize) -> usize {
        self.table.map_or(d, |t| t[d] as usize)
    }

    fn rank(&self) -> usize {
        self.w1.dims[1]
    }

    fn row_e(&self, prev: u32) -> Vec<f32> {
        let r = self.rank();
        let mut e = vec![0f32; r];
        self.w1.row(prev as usize).read_into(0, &mut e);
        e
    }

    /// `mult * (base + W2[d] . e)`, the dot as sequential fused multiply-adds.
    fn biased(&self, b: usize, k: usize, d: usize, e: &[f32]) -> f32 {
        let w = self.w2.row(d);
        let mut acc = 0f32;
        for (jj, &ej) in e.iter().enumerate() {
            acc = w.get(jj).mul_add(ej, acc);
        }
        self.mult * (self.base.row(b, k).get(d) + acc)
    }
}

/// `dspark_sb_pick`'s dense draw over a row's chunk statistics; `l` is the row by draft id.
/// Returns `(draft id, status, max, normalizer)`.
fn pick_dense(stats: &[VfChunk], l: &[f32], greedy: bool, u: f64) -> (usize, u32, f32, f64) {
    let (best, arg, nn, _) = merge_chunks(stats, false, 1.0);
    let status = validity(best, nn, sb_status::NONFINITE, sb_status::NOFINITE);
    let weight = |c: &VfChunk| {
        if c.sum > 0.0 {
            f64::from(c.sum) * f64::from(exp(c.max - best))
        } else {
            0.0
        }
    };
    let z = if !greedy && status == 0 {
        merge_chunks(stats, true, 1.0).3
    } else {
        0.0
    };
    let mut d = arg as usize;
    if !greedy && status == 0 && z > 0.0 {
        let target = u * z;
        let (chosen, before) = walk_parts(stats.iter().map(weight), 0.0, target);
        let cmax = stats[chosen].max;
        let scale = f64::from(exp(cmax - best));
        let lo = |t: usize| chosen * SB_CHUNK + t * SB_CPT;
        let w = |d: usize| f64::from(exp(l[d] - cmax)) * scale;
        let segs: Vec<f64> = (0..THREADS)
            .map(|t| {
                let mut seg = 0f64;
                for d in lo(t)..(lo(t) + SB_CPT).min(l.len()) {
                    seg += w(d);
                }
                seg
            })
            .collect();
        let (at, at_pre) = walk_parts(segs.iter().copied(), before, target);
        let mut acc = at_pre;
        let mut last = None;
        for dd in lo(at)..(lo(at) + SB_CPT).min(l.len()) {
            let x = w(dd);
            if x > 0.0 {
                acc += x;
                last = Some(dd);
                if acc > target {
                    break;
                }
            }
        }
        if let Some(x) = last {
            d = x;
        }
    }
    (d, status, best, z)
}

/// `dspark_sb_pick`'s top-k draw over the candidates' values `l` (id order).
fn pick_top_k(cand: &[usize], l: &[f32], greedy: bool, u: f64) -> (usize, u32, f32, f64) {
    let (mut best, mut j, mut nans) = (f32::NEG_INFINITY, 0usize, 0u32);
    for (i, &v) in l.iter().enumerate() {
        if v.is_nan() {
            nans += 1;
        } else if v > best {
            best = v;
            j = i;
        }
    }
    let status = validity(best, nans, sb_status::NONFINITE, sb_status::NOFINITE);
    let mut z = 0f64;
    if !greedy && status == 0 {
        for &v in l {
            z += f64::from(exp(v - best));
        }
        let target = u * z;
        let (mut acc, mut last) = (0f64, None);
        for (i, &v) in l.iter().enumerate() {
            let w = f64::from(exp(v - best));
            if w > 0.0 {
                last = Some(i);
                acc += w;
                if acc > target {
                    break;
                }
            }
        }
        if let Some(i) = last {
            j = i;
        }
    }
    (cand.get(j).copied().unwrap_or(0), status, best, z)
}

/// `dspark_sb_topk` for row `(b, k)`: its status and id-ordered candidates.
fn candidates(call: &Call<'_>, b: usize, k: usize, top_k: usize) -> (u32, Vec<usize>) {
    let row = call.base.row(b, k).sub(0, call.valid);
    let (mut m, mut nans) = (f32::NEG_INFINITY, 0u32);
    for v in 0..row.len() {
        let x = row.get(v);
        if x.is_nan() {
            nans += 1;
        } else if x > m {
            m = x;
        }
    }
    let status = validity(m, nans, sb_status::BASE_NONFINITE, sb_status::BASE_NOFINITE);
    if status != 0 {
        return (status, Vec::new());
    }
    let cut = radix(row, None, Goal::Count(top_k as u64), m, 1.0).map(|r| r.cut);
    let keeps = |x: f32, v: usize| finite(x) && cut.is_some_and(|c: KeyCut| c.keeps(x, v as u32));
    let mut ids: Vec<usize> = (0..row.len()).filter(|&v| keeps(row.get(v), v)).collect();
    ids.truncate(top_k);
    (0, ids)
}

/// The model of a block-sampler call.
pub(crate) fn run(call: &Call<'_>) -> Output {
    let [b_n, k_n, _] = call.base.dims;
    let (vt, r, valid) = (call.vocab_t, call.rank(), call.valid);
    let sampled = !call.greedy;
    let fill = if call.table.is_some() || call.top_k.is_some() {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    let mut o = Output {
        tokens: vec![0; b_n * k_n],
        status: vec![0; b_n * k_n],
        witness: vec![0; b_n],
        out: vec![fill; b_n * k_n * vt],
        emb: vec![0.0; b_n * k_n * r],
    };
    let cands: Vec<(u32, Vec<usize>)> = match call.top_k {
        Some(tk) => (0..b_n * k_n)
            .map(|i| candidates(call, i / k_n, i % k_n, tk))
            .collect(),
        None => Vec::new(),
    };
    for (i, (s, _)) in cands.iter().enumerate() {
        o.status[i] = *s;
    }
    let mut prev: Vec<u32> = call.anchors.to_vec();
    for k in 0..k_n {
        for b in 0..b_n {
            let e = call.row_e(prev[b]);
            let u = Stream::from_raw(call.streams[b]).uniform(Tag::Draft, k as u64, 0);
            let row_at = (b * k_n + k) * vt;
            let (d, status, m, z) = match call.top_k {
                Some(_) => {
                    let ids = &cands[b * k_n + k].1;
                    let l: Vec<f32> = ids.iter().map(|&d| call.biased(b, k, d, &e)).collect();
                    for (&d, &v) in ids.iter().zip(&l) {
                        o.out[row_at + call.map(d)] = v;
                    }
                    let picked = pick_top_k(ids, &l, call.greedy, u);
                    if call.greedy {
                        for &d in ids {
                            o.out[row_at + call.map(d)] = f32::NEG_INFINITY;
                        }
                        o.out[row_at + call.map(picked.0)] = 0.0;
                    }
                    picked
                }
                None => {
                    let l: Vec<f32> = (0..valid).map(|d| call.biased(b, k, d, &e)).collect();
                    if sampled {
                        for (d, &v) in l.iter().enumerate() {
                            o.out[row_at + call.map(d)] = v;
                        }
                    }
                    let stats: Vec<VfChunk> = (0..sb_chunks(valid))
                        .map(|c| {
                            let start = c * SB_CHUNK;
                            let len = SB_CHUNK.min(valid - start);
                            chunk_stats(len, |j| l[start + j], start, sampled, 1.0)
                        })
                        .collect();
                    pick_dense(&stats, &l, call.greedy, u)
                }
            };
            let tok = call.map(d) as u32;
            o.tokens[b * k_n + k] = tok;
            if call.top_k.is_none() || o.status[b * k_n + k] == 0 {
                o.status[b * k_n + k] = status;
            }
            let h = if k == 0 {
                0x4528_21e6_38d0_1377
            } else {
                o.witness[b]
            };
            let h = combine(h, (u64::from(m.to_bits()) << 32) | u64::from(tok));
            o.witness[b] = combine(h, z.to_bits());
            o.emb[(b * k_n + k) * r..(b * k_n + k + 1) * r].copy_from_slice(&e);
            prev[b] = tok;
        }
    }
    if call.greedy && call.top_k.is_none() {
        for (i, &t) in o.tokens.iter().enumerate() {
            let row = &mut o.out[i * vt..(i + 1) * vt];
            row.fill(f32::NEG_INFINITY);
            row[t as usize] = 0.0;
        }
    }
    o
}

/// The fast path's first error among the status words (`[B, K]`): base-row errors of the
/// top-k candidates in row order, then draft-logit errors slot by slot.
pub(crate) fn decode(status: &[u32], batch: usize, slots: usize) -> Result<()> {
    for (i, &s) in status.iter().enumerate() {
        let (b, k) = (i / slots.max(1), i % slots.max(1));
        let where_ = || format!("base logits (request {b}, slot {k})");
        match s {
            sb_status::BASE_NONFINITE => return Err(nan_in("base_logits", &where_())),
            sb_status::BASE_NOFINITE => {
                return Err(no_finite("base_logits", &where_(), Scope::Vocabulary));
            }
            _ => {}
        }
    }
    for k in 0..slots {
        for b in 0..batch {
            let where_ = || format!("draft logits (request {b}, slot {k})");
            match status[b * slots + k] {
                0 => {}
                sb_status::NONFINITE => return Err(nan_in("base_logits", &where_())),
                sb_status::NOFINITE => {
                    return Err(no_finite("base_logits", &where_(), Scope::Vocabulary));
                }
                sb_status::BASE_NONFINITE | sb_status::BASE_NOFINITE => {}
                other => {
                    return Err(Error::Internal {
                        message: format!("fused block sampler: unknown status {other}"),
                    });
                }
            }
        }
    }
    Ok(())
}
