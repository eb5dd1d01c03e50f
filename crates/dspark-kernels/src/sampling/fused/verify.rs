//! The Rust model of `kernels/fused_verify.cu`: the four launches' arithmetic in their order,
//! per request, over host rows. It is the fused verification's `cpu_fwd`: what
//! `DSPARK_KERNEL_PATH=fused` runs on the CPU, and what the GPU (and the kernels' host
//! emulation) must reproduce word for word. [`decode`] turns the words into a
//! [`Verification`] or the fast path's first error.

use super::layout::{
    THREADS, VF_CHUNK, VF_EPT, VfChunk, VfReq, VfResid, VfRow, flag, status, vf_chunks,
    vf_out_words,
};
use super::math::{
    Goal, KeyCut, block_sum, chunk_stats, finite, merge_chunks, radix, validity, walk_parts,
    weight, wfx,
};
use crate::cpu::par::{map_range, worth_parallel};
use crate::error::{Error, Result};
use crate::sampling::dist::{Scope, nan_in, no_finite};
use crate::sampling::rng::{Stream, Tag, combine};
use crate::sampling::verify::request::{Request, Verification};
use crate::view::{Floats, Rows3};

const NONE: u32 = u32::MAX;

/// A verification call as the kernels see it: shapes, requests, stops, inputs.
pub(crate) struct Call<'a> {
    /// `[B, K+1, V]` target logits.
    pub target: Rows3<'a>,
    /// `[B, K, V]` draft logits.
    pub draft: Option<Rows3<'a>>,
    /// `[B, K]` draft ids.
    pub tokens: &'a [i64],
    /// One per request.
    pub reqs: &'a [VfReq],
    /// Sorted stop ids.
    pub stops: &'a [u32],
}

/// The per-request settings of the parameter block.
pub(crate) fn vf_req(r: &Request, vocab: usize) -> VfReq {
    let greedy = r.greedy();
    let n = r.num_draft as u32 | if greedy { 1 << 31 } else { 0 };
    VfReq {
        stream: r.stream.raw(),
        s: if greedy { 1.0 } else { 1.0 / r.temperature },
        top_p: r.top_p,
        top_k: r
            .top_k
            .filter(|&k| k < vocab)
            .map_or(u32::MAX, |k| k as u32),
        n,
    }
}

/// `vf_merge` over the chunks of a whole row (each from `vf_chunk`).
fn merge(row: Floats<'_>, want_sum: bool, s: f32) -> (f32, u32, u32, f64) {
    let v = row.len();
    let chunks: Vec<VfChunk> = (0..vf_chunks(v))
        .map(|c| {
            let start = c * VF_CHUNK;
            let len = VF_CHUNK.min(v - start);
            chunk_stats(len, |j| row.get(start + j), start, want_sum, s)
        })
        .collect();
    merge_chunks(&chunks, want_sum, s)
}

impl Call<'_> {
    fn dims(&self) -> (usize, usize, usize) {
        let [_, w, v] = self.target.dims;
        (w, w - 1, v)
    }

    fn token(&self, r: usize, i: usize) -> i64 {
        let (_, k, _) = self.dims();
        self.tokens[r * k + i]
    }

    /// `dspark_vf_rows` for row `i` of request `r` (with `dspark_vf_stats` of its rows).
    fn row(&self, r: usize, i: usize) -> VfRow {
        let (_, _, v) = self.dims();
        let q = &self.reqs[r];
        let (n, greedy) = (q.num_draft(), q.greedy());
        let trow = self.target.row(r, i);
        let mut rec = VfRow::default();
        let (m, am, nans, z) = merge(trow, !greedy, q.s);
        (rec.m, rec.argmax, rec.zp) = (m, am, z);
        rec.flags = validity(m, nans, flag::T_NONFINITE, flag::T_NOFINITE);
        if let Some(d) = self.draft.filter(|_| i < n) {
            let (mq, _, dn, zq) = merge(d.row(r, i), !greedy, 1.0);
            (rec.mq, rec.zq) = (mq, zq);
            rec.flags |= validity(mq, dn, flag::D_NONFINITE, flag::D_NOFINITE);
        }
        let tvalid = rec.flags & (flag::T_NONFINITE | flag::T_NOFINITE) == 0;
        let topk = (q.top_k as usize) < v;
        if !greedy && tvalid && (topk || q.top_p < 1.0) {
            truncate(trow, q, &mut rec, topk);
        }
        if i < n {
            let x = self.token(r, i);
            let dvalid = rec.flags & (flag::D_NONFINITE | flag::D_NOFINITE) == 0;
            if greedy {
                if x == i64::from(rec.argmax) {
                    rec.flags |= flag::ACCEPT;
                }
            } else if tvalid && dvalid && x >= 0 && (x as usize) < v {
                let x = x as usize;
                let xv = trow.get(x);
                let kept = xv > f32::NEG_INFINITY
                    && (rec.flags & flag::CUT == 0 || cut_of(&rec).keeps(xv, x as u32));
                let px = if kept {
                    f64::from(weight(xv, rec.m, q.s)) / rec.zp
                } else {
                    0.0
                };
                let qx = match self.draft {
                    Some(d) => {
                        let yv = d.row(r, i).get(x);
                        if yv > f32::NEG_INFINITY {
                            f64::from(weight(yv, rec.mq, 1.0)) / rec.zq
                        } else {
                            0.0
                        }
                    }
                    None => 1.0,
                };
                let u = Stream::from_raw(q.stream).uniform(Tag::Accept, i as u64, 0);
                if u * qx < px {
                    rec.flags |= flag::ACCEPT;
                }
            }
        }
        rec
    }
}

fn cut_of(rec: &VfRow) -> KeyCut {
    KeyCut {
        key: rec.cut_key,
        id: rec.cut_id,
    }
}

/// `vf_truncate`.
fn truncate(row: Floats<'_>, q: &VfReq, rec: &mut VfRow, topk: bool) {
    let mut cut = None;
    let mut flags = flag::CUT;
    if topk {
        cut = radix(row, None, Goal::Count(u64::from(q.top_k)), rec.m, q.s).map(|r| r.cut);
        flags |= flag::TOPK;
    }
    let (cut, zfx) = if q.top_p < 1.0 {
        match radix(row, cut, Goal::Fraction(q.top_p), rec.m, q.s) {
            Some(r) => (r.cut, r.mass),
            None => (KeyCut::default(), 0),
        }
    } else {
        let c = cut.unwrap_or_default();
        let mut acc = 0u64;
        for v in 0..row.len() {
            let x = row.get(v);
            if finite(x) && c.keeps(x, v as u32) {
                acc = acc.wrapping_add(wfx(x, rec.m, q.s));
            }
        }
        (c, acc)
    };
    rec.flags |= flags;
    (rec.cut_key, rec.cut_id) = (cut.key, cut.id);
    rec.zfx = zfx;
    rec.zp = zfx as f64 * (1.0 / 1_099_511_627_776.0);
}

/// `VfOutcome`: where a request's round ends.
#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    kind: u32,
    pos: u32,
    detail: i64,
    accepted: u32,
    /// 0 none, 1 residual at `j`, 2 from `p` at `j`.
    draw: u32,
    j: usize,
    last: i64,
}

/// `vf_walk`.
fn walk(call: &Call<'_>, r: usize, rows: &[VfRow]) -> Outcome {
    let (_, _, v) = call.dims();
    let q = &call.reqs[r];
    let (n, greedy) = (q.num_draft(), q.greedy());
    let mut o = Outcome {
        last: -1,
        ..Outcome::default()
    };
    let err = |mut o: Outcome, kind: u32, pos: usize| {
        (o.kind, o.pos) = (kind, pos as u32);
        o
    };
    for i in 0..n {
        let x = call.token(r, i);
        if x < 0 || x >= v as i64 {
            o.detail = x;
            return err(o, status::TOKEN, i);
        }
    }
    let has_draft = call.draft.is_some();
    let (mut checked, mut dchecked, mut ended) = (0usize, 0usize, false);
    for (i, row) in rows.iter().enumerate().take(n) {
        checked = i + 1;
        let f = row.flags;
        if f & flag::T_NONFINITE != 0 {
            return err(o, status::T_NONFINITE, i);
        }
        if f & flag::T_NOFINITE != 0 {
            return err(o, status::T_NOFINITE, i);
        }
        if greedy {
            if f & flag::ACCEPT == 0 {
                (o.j, o.last, ended) = (i, i64::from(row.argmax), true);
                break;
            }
        } else {
            if has_draft {
                dchecked = i + 1;
                if f & flag::D_NONFINITE != 0 {
                    return err(o, status::D_NONFINITE, i);
                }
                if f & flag::D_NOFINITE != 0 {
                    return err(o, status::D_NOFINITE, i);
                }
            }
            if f & flag::ACCEPT == 0 {
                (o.j, o.draw, ended) = (i, 1, true);
                break;
            }
        }
        o.accepted += 1;
        let x = call.token(r, i);
        if u32::try_from(x).is_ok_and(|x| call.stops.binary_search(&x).is_ok()) {
            ended = true;
            break;
        }
    }
    if !ended {
        checked = n + 1;
        let f = rows[n].flags;
        if f & flag::T_NONFINITE != 0 {
            return err(o, status::T_NONFINITE, n);
        }
        if f & flag::T_NOFINITE != 0 {
            return err(o, status::T_NOFINITE, n);
        }
        o.j = n;
        if greedy {
            o.last = i64::from(rows[n].argmax);
        } else {
            o.draw = 2;
        }
    }
    for (i, row) in rows.iter().enumerate().take(n + 1).skip(checked) {
        if row.flags & flag::T_NONFINITE != 0 {
            return err(o, status::T_NONFINITE, i);
        }
        if row.flags & flag::T_NOFINITE != 0 {
            return err(o, status::T_NOFINITE, i);
        }
    }
    if has_draft {
        for (i, row) in rows.iter().enumerate().take(n).skip(dchecked) {
            if row.flags & flag::D_NONFINITE != 0 {
                return err(o, status::D_NONFINITE, i);
            }
        }
    }
    o
}

/// `VfDrawRow`: the draw weights of the draw row.
struct DrawRow<'a> {
    trow: Floats<'a>,
    drow: Option<Floats<'a>>,
    m: f32,
    s: f32,
    mq: f32,
    inv_zp: f32,
    inv_zq: f32,
    cut: Option<KeyCut>,
    onehot: u32,
}

impl DrawRow<'_> {
    /// `vf_pw`.
    fn pw(&self, v: usize) -> f32 {
        let x = self.trow.get(v);
        let kept = x > f32::NEG_INFINITY && self.cut.is_none_or(|c| c.keeps(x, v as u32));
        if kept { weight(x, self.m, self.s) } else { 0.0 }
    }

    /// `vf_rw`.
    fn rw(&self, v: usize, w: f32) -> f32 {
        let pv = w * self.inv_zp;
        let qv = match self.drow {
            Some(d) => weight(d.get(v), self.mq, 1.0) * self.inv_zq,
            None => {
                if v as u32 == self.onehot {
                    1.0
                } else {
                    0.0
                }
            }
        };
        let rr = pv - qv;
        if rr > 0.0 { rr } else { 0.0 }
    }

    fn value(&self, v: usize, residual: bool) -> f32 {
        let w = self.pw(v);
        if residual { self.rw(v, w) } else { w }
    }
}

/// `vf_resid_chunk` over every chunk: `(rsum, msum)` per chunk (thread `t` sums values
/// `t, t + 256, ...` of the chunk, in order).
fn resid_sums(d: &DrawRow<'_>, vocab: usize, residual: bool) -> Vec<VfResid> {
    (0..vf_chunks(vocab))
        .map(|c| {
            let start = c * VF_CHUNK;
            let (mut rs, mut ms) = ([0f32; THREADS], [0f32; THREADS]);
            for v in start..(start + VF_CHUNK).min(vocab) {
                let t = (v - start) % THREADS;
                let w = d.pw(v);
                ms[t] += w;
                if residual {
                    rs[t] += d.rw(v, w);
                }
            }
            VfResid {
                rsum: block_sum(&rs),
                msum: block_sum(&ms),
            }
        })
        .collect()
}

/// `vf_draw_id`: the inverse CDF in id order over chunk sums `sums`.
fn draw_id(d: &DrawRow<'_>, vocab: usize, sums: &[f32], residual: bool, total: f64, u: f64) -> i64 {
    let target = u * total;
    let (chosen, before) = walk_parts(sums.iter().map(|&s| f64::from(s)), 0.0, target);
    let lo = |t: usize| chosen * VF_CHUNK + t * VF_EPT;
    let segs: Vec<f64> = (0..THREADS)
        .map(|t| {
            let mut seg = 0f64;
            for v in lo(t)..(lo(t) + VF_EPT).min(vocab) {
                seg += f64::from(d.value(v, residual));
            }
            seg
        })
        .collect();
    let (at, at_pre) = walk_parts(segs.iter().copied(), before, target);
    let (mut acc, mut last) = (at_pre, -1i64);
    for v in lo(at)..(lo(at) + VF_EPT).min(vocab) {
        let x = f64::from(d.value(v, residual));
        if x > 0.0 {
            acc += x;
            last = v as i64;
            if acc > target {
                break;
            }
        }
    }
    last
}

impl Call<'_> {
    /// `dspark_vf_resid` + `dspark_vf_pick`'s draw for an outcome that draws: the token, and
    /// the chunk sums when `dspark_vf_resid` computed them.
    fn draw(&self, r: usize, o: &Outcome, rows: &[VfRow]) -> (i64, Vec<VfResid>) {
        let (_, _, v) = self.dims();
        let q = &self.reqs[r];
        let rec = &rows[o.j];
        let residual = o.draw == 1;
        let u = Stream::from_raw(q.stream).uniform(Tag::Residual, o.j as u64, 0);
        let d = DrawRow {
            trow: self.target.row(r, o.j),
            drow: self.draft.filter(|_| residual).map(|d| d.row(r, o.j)),
            m: rec.m,
            s: q.s,
            mq: rec.mq,
            inv_zp: (1.0 / rec.zp) as f32,
            inv_zq: if self.draft.is_some() {
                (1.0 / rec.zq) as f32
            } else {
                0.0
            },
            cut: (rec.flags & flag::CUT != 0).then(|| cut_of(rec)),
            onehot: if residual && self.draft.is_none() {
                self.token(r, o.j) as u32
            } else {
                NONE
            },
        };
        let topk = rec.flags & flag::TOPK != 0;
        let sums = if residual || !topk {
            resid_sums(&d, v, residual)
        } else {
            Vec::new()
        };
        if residual {
            let total = sums.iter().fold(0f64, |a, s| a + f64::from(s.rsum));
            if total > 1e-9 {
                let rs: Vec<f32> = sums.iter().map(|s| s.rsum).collect();
                return (draw_id(&d, v, &rs, true, total, u), sums);
            }
        }
        if topk {
            let t =
                radix(d.trow, d.cut, Goal::Draw(u), rec.m, q.s).map_or(0, |k| i64::from(k.cut.id));
            return (t, sums);
        }
        let total = sums.iter().fold(0f64, |a, s| a + f64::from(s.msum));
        if total.is_nan() || total <= 0.0 {
            return (i64::from(rec.argmax), sums);
        }
        let ms: Vec<f32> = sums.iter().map(|s| s.msum).collect();
        (draw_id(&d, v, &ms, false, total, u), sums)
    }

    /// Request `r`'s output words.
    fn request(&self, r: usize) -> Vec<i64> {
        let (w, _, _) = self.dims();
        let n = self.reqs[r].num_draft();
        let rows: Vec<VfRow> = (0..=n).map(|i| self.row(r, i)).collect();
        let mut o = walk(self, r, &rows);
        let mut sums = Vec::new();
        if o.kind == 0 && o.draw != 0 {
            (o.last, sums) = self.draw(r, &o, &rows);
        }
        let mut out = vec![-1i64; vf_out_words(w)];
        for (k, slot) in out.iter_mut().enumerate().take(o.accepted as usize) {
            *slot = self.token(r, k);
        }
        if o.kind == 0 && o.last >= 0 {
            out[o.accepted as usize] = o.last;
        }
        out[w] = i64::from(o.accepted);
        out[w + 1] = if o.kind != 0 {
            (i64::from(o.kind) << 32) | i64::from(o.pos)
        } else {
            0
        };
        out[w + 2] = o.detail;
        out[w + 3] = witness(&rows, &sums) as i64;
        out
    }
}

/// `vf_witness`: a hash of the row verdicts and the chunk sums (when computed).
fn witness(rows: &[VfRow], sums: &[VfResid]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for rec in rows {
        h = combine(h, rec.zp.to_bits());
        h = combine(h, rec.zq.to_bits());
        h = combine(h, rec.zfx);
        h = combine(
            h,
            (u64::from(rec.m.to_bits()) << 32) | u64::from(rec.mq.to_bits()),
        );
        h = combine(h, (u64::from(rec.cut_key) << 32) | u64::from(rec.cut_id));
        h = combine(h, (u64::from(rec.argmax) << 32) | u64::from(rec.flags));
    }
    for s in sums {
        h = combine(
            h,
            (u64::from(s.rsum.to_bits()) << 32) | u64::from(s.msum.to_bits()),
        );
    }
    h
}

/// The model of the four launches: every request's output words, in order.
pub(crate) fn run(call: &Call<'_>) -> Vec<i64> {
    let [b, w, v] = call.target.dims;
    let par = worth_parallel(b * w * v);
    let rows: Vec<Vec<i64>> = map_range(par, b, |r| call.request(r));
    rows.concat()
}

/// Turn the output words of `batch` requests of width `width` into the fast path's result or
/// its first error: a draft token out of range (the checks of every request's inputs come
/// first), then the first request's row error.
pub(crate) fn decode(
    words: &[i64],
    batch: usize,
    width: usize,
    vocab: usize,
) -> Result<Verification> {
    let per = vf_out_words(width);
    if words.len() != batch * per {
        return Err(Error::Internal {
            message: format!(
                "fused verify returned {} words for {batch} requests of width {width}",
                words.len()
            ),
        });
    }
    let word = |r: usize| words[r * per + width + 1];
    let split = |s: i64| ((s >> 32) as u32, (s & 0xffff_ffff) as usize);
    for r in 0..batch {
        if split(word(r)).0 == status::TOKEN {
            return Err(Error::TokenOutOfRange {
                name: "draft_tokens".into(),
                id: words[r * per + width + 2],
                vocab_size: vocab,
            });
        }
    }
    for r in 0..batch {
        let (kind, i) = split(word(r));
        let target = || format!("target row (request {r}, position {i})");
        let draft = || format!("draft row (request {r}, position {i})");
        match kind {
            0 => {}
            status::T_NONFINITE => return Err(nan_in("target_logits", &target())),
            status::T_NOFINITE => {
                return Err(no_finite("target_logits", &target(), Scope::Masked));
            }
            status::D_NONFINITE => return Err(nan_in("draft_logits", &draft())),
            status::D_NOFINITE => {
                return Err(no_finite("draft_logits", &draft(), Scope::Masked));
            }
            other => {
                return Err(Error::Internal {
                    message: format!("fused verify: unknown status {other} for request {r}"),
                });
            }
        }
    }
    let mut tokens = Vec::with_capacity(batch * width);
    let mut num_accepted = Vec::with_capacity(batch);
    for r in 0..batch {
        tokens.extend_from_slice(&words[r * per..r * per + width]);
        num_accepted.push(words[r * per + width] as u32);
    }
    Ok(Verification {
        batch,
        width,
        tokens,
        num_accepted,
    })
}
