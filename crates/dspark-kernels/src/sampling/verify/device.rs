//! Verification on the device-generic tensor path (the semantics of the host kernel, `cpu.rs`).
//!
//! Every position of every request is evaluated at once on the device: the target argmax, the
//! target distribution `p` (temperature, top-k, top-p), the accept test `u·q(x) < p(x)`, the
//! residual draw and a draw from `p` itself (the bonus, or the fallback of an empty residual),
//! with the fast path's counter-based uniforms computed on the host and uploaded. A few numbers
//! per row come back; the host then walks each request's positions like the fast path (first
//! rejection, stop tokens, `num_draft`) and reports the fast path's errors in its order.

use candle_core::{DType, Tensor};

use super::{Plan, Request, Verification, greedy_check};
use crate::error::{Error, Result};
use crate::sampling::categorical::Check;
use crate::sampling::dist::{Scope, check_row};
use crate::sampling::ops::{
    Cut, Goal, argmax_lowest, clean_rows, column_f32, column_f64, ids_f32, pad_rows, pick,
    prefix_cut, row_flags, row_sums, top_k_cut, weights, widen,
};
use crate::sampling::rng::Tag;
use crate::sampling::transfer::{Download, Fetched};

/// Residual mass below which the residual counts as empty (the fast path's constant).
const EMPTY_RESIDUAL: f64 = 1e-9;

/// Slots of the downloaded per-row results.
struct Slots {
    tmax: usize,
    tnans: usize,
    argmax: usize,
    draft: Option<(usize, usize)>,
    /// `(p-sample, accept, residual)`, present when some request samples.
    sampled: Option<(usize, Option<(usize, usize)>)>,
}

/// Verify `target` `[B, K+1, V]` (f32/f16/bf16, any device) against the host draft tokens
/// `[B, K]` and optional draft logits `[B, K, V]` on the same device; `plan` is the validated
/// call.
pub(crate) fn verify_tensors(
    plan: &Plan,
    target: &Tensor,
    draft_tokens: &[i64],
    draft: Option<&Tensor>,
) -> Result<Verification> {
    let [b, w, v] = plan.dims;
    let k = w - 1;
    if b == 0 {
        return Ok(Verification {
            batch: 0,
            width: w,
            tokens: Vec::new(),
            num_accepted: Vec::new(),
        });
    }
    let dev = target.device();
    let reqs = &plan.requests;
    let rows = |t: &Tensor, n: usize| -> Result<Tensor> {
        pad_rows(&t.to_dtype(DType::F32)?.reshape((n, v))?, f32::NEG_INFINITY)
    };
    let (x, tmax, tnans) = clean_rows(&rows(target, b * w)?)?;
    let vp = x.dim(1)?;
    let mut dl = Download::default();
    let argmax = argmax_lowest(&x, &tmax)?;
    let mut slots = Slots {
        tmax: dl.push(&tmax)?,
        tnans: dl.push(&tnans)?,
        argmax: dl.push(&argmax)?,
        draft: None,
        sampled: None,
    };
    let dclean = match draft {
        Some(d) if k > 0 => {
            let (xd, dmax, dnans) = clean_rows(&rows(d, b * k)?)?;
            slots.draft = Some((dl.push(&dmax)?, dl.push(&dnans)?));
            Some((xd, dmax))
        }
        _ => None,
    };
    if reqs.iter().any(|r| !r.greedy()) {
        let per_row = |f: &dyn Fn(&Request, usize) -> f64| -> Vec<f64> {
            (0..b * w).map(|i| f(&reqs[i / w], i % w)).collect()
        };
        let sampled = |r: &Request| !r.greedy();
        let s: Vec<f32> = per_row(&|r, _| {
            if sampled(r) {
                f64::from(1.0 / r.temperature)
            } else {
                1.0
            }
        })
        .iter()
        .map(|&x| x as f32)
        .collect();
        let top_k = |r: &Request| r.top_k.filter(|&t| sampled(r) && t < v);
        let wt = weights(&x, &tmax, &column_f32(&s, dev)?)?;
        let flags = |f: &dyn Fn(&Request) -> bool| -> Vec<bool> {
            (0..b * w).map(|i| f(&reqs[i / w])).collect()
        };
        let by_value = flags(&|r| top_k(r).is_some());
        let nucleus = flags(&|r| sampled(r) && r.top_p < 1.0);
        let (mut xk, mut wk) = (x.clone(), wt);
        if by_value.contains(&true) {
            let kcol = per_row(&|r, _| top_k(r).map_or(1.0, |t| t as f64));
            let cut = top_k_cut(&x, &column_f64(&kcol, dev)?)?;
            (xk, wk) = restrict(&xk, &wk, &cut, &by_value)?;
        }
        if nucleus.contains(&true) {
            let pcol = per_row(&|r, _| f64::from(r.top_p));
            let (cut, _) = prefix_cut(&xk, &wk, Goal::Fraction(&column_f64(&pcol, dev)?), false)?;
            (xk, wk) = restrict(&xk, &wk, &cut, &nucleus)?;
        }
        let z = row_sums(&wk)?;
        let u_res = column_f64(
            &per_row(&|r, i| r.stream.uniform(Tag::Residual, i as u64, 0)),
            dev,
        )?;
        let mut ps = pick(&wk, &(&u_res * &z)?, &argmax)?;
        if by_value.contains(&true) {
            let (cut, _) = prefix_cut(&xk, &wk, Goal::Fraction(&u_res), true)?;
            ps = row_flags(&by_value, dev)?.where_cond(&cut.id, &ps)?;
        }
        let ps_slot = dl.push(&ps)?;
        let mut pair = None;
        if k > 0 {
            let first_k = |t: &Tensor| -> Result<Tensor> {
                let c = t.dim(1)?;
                Ok(t.reshape((b, w, c))?
                    .narrow(1, 0, k)?
                    .reshape((b * k, c))?
                    .contiguous()?)
            };
            let toks: Vec<u32> = (0..b * k)
                .map(|i| {
                    let (r, j) = (i / k, i % k);
                    let t = draft_tokens[i];
                    if j < reqs[r].num_draft { t as u32 } else { 0 }
                })
                .collect();
            let tok = Tensor::from_slice(&toks, (b * k, 1), dev)?;
            let (wp, zp) = (first_k(&wk)?, first_k(&z)?);
            let px = (wp.gather(&tok, 1)?.to_dtype(DType::F64)? / &zp)?;
            let pv = wp.broadcast_mul(&zp.recip()?.to_dtype(DType::F32)?)?;
            let (qx, qv) = match &dclean {
                Some((xd, dmax)) => {
                    let ones = Tensor::ones((b * k, 1), DType::F32, dev)?;
                    let wq = weights(xd, dmax, &ones)?;
                    let zq = row_sums(&wq)?;
                    let qx = (wq.gather(&tok, 1)?.to_dtype(DType::F64)? / &zq)?;
                    let qv = wq.broadcast_mul(&zq.recip()?.to_dtype(DType::F32)?)?;
                    (qx, qv)
                }
                None => {
                    let ids = ids_f32(vp, dev)?;
                    let onehot = ids
                        .broadcast_eq(&tok.to_dtype(DType::F32)?)?
                        .to_dtype(DType::F32)?;
                    (Tensor::ones((b * k, 1), DType::F64, dev)?, onehot)
                }
            };
            let u_acc: Vec<f64> = (0..b * k)
                .map(|i| reqs[i / k].stream.uniform(Tag::Accept, (i % k) as u64, 0))
                .collect();
            let accept = (column_f64(&u_acc, dev)? * qx)?.lt(&px)?;
            let resid = (pv - qv)?.relu()?;
            let rz = row_sums(&resid)?;
            let ps_k = first_k(&ps)?;
            let rid = pick(&resid, &(first_k(&u_res)? * &rz)?, &ps_k)?;
            let resid_tok = rz.le(EMPTY_RESIDUAL)?.where_cond(&ps_k, &rid)?;
            pair = Some((dl.push(&accept)?, dl.push(&resid_tok)?));
        }
        slots.sampled = Some((ps_slot, pair));
    }
    let got = dl.fetch()?;
    let mut tokens = Vec::with_capacity(b * w);
    let mut num_accepted = Vec::with_capacity(b);
    for (r, req) in reqs.iter().enumerate() {
        let (out, a) = walk(
            r,
            req,
            w,
            &draft_tokens[r * k..(r + 1) * k],
            &got,
            &slots,
            plan,
        )?;
        tokens.extend(out);
        num_accepted.push(a);
    }
    Ok(Verification {
        batch: b,
        width: w,
        tokens,
        num_accepted,
    })
}

/// Restrict `(x, w)` to the tokens `cut` keeps, on the rows `active` flags.
fn restrict(x: &Tensor, w: &Tensor, cut: &Cut, active: &[bool]) -> Result<(Tensor, Tensor)> {
    let inactive: Vec<bool> = active.iter().map(|&a| !a).collect();
    let vp = x.dim(1)?;
    let all = widen(&row_flags(&inactive, x.device())?, vp)?;
    let keep = cut.keeps(x)?.maximum(&all)?;
    let ninf = Tensor::full(f32::NEG_INFINITY, x.dims(), x.device())?;
    Ok((
        keep.where_cond(x, &ninf)?,
        keep.where_cond(w, &w.zeros_like()?)?,
    ))
}

/// Request `r`'s round from the downloaded per-row results, in the fast path's order
/// (validation included): its `K+1` ids and the number accepted.
fn walk(
    r: usize,
    req: &Request,
    w: usize,
    drafts: &[i64],
    got: &Fetched,
    slots: &Slots,
    plan: &Plan,
) -> Result<(Vec<i64>, u32)> {
    let (k, n) = (w - 1, req.num_draft);
    let at = |slot: usize, i: usize| got.get(slot)[i];
    let tcheck = |i: usize| -> Result<()> {
        let c = Check {
            max: at(slots.tmax, r * w + i) as f32,
            nans: at(slots.tnans, r * w + i) as u32,
        };
        greedy_check(&c, || format!("target row (request {r}, position {i})"))
    };
    let dcheck = |i: usize, full: bool| -> Result<()> {
        let Some((dmax, dnans)) = slots.draft else {
            return Ok(());
        };
        let c = Check {
            max: at(dmax, r * k + i) as f32,
            nans: at(dnans, r * k + i) as u32,
        };
        let (nan, empty) = (c.non_finite(), full && !c.has_finite());
        check_row("draft_logits", nan, empty, Scope::Masked, || {
            format!("draft row (request {r}, position {i})")
        })
    };
    let argmax = |i: usize| at(slots.argmax, r * w + i) as i64;
    let psample = |i: usize| slots.sampled.map_or(0, |(p, _)| at(p, r * w + i) as i64);
    let mut out = vec![-1i64; w];
    let (mut accepted, mut ended, mut checked, mut dchecked) = (0u32, false, 0usize, 0usize);
    for (i, &x) in drafts.iter().take(n).enumerate() {
        checked = i + 1;
        tcheck(i)?;
        let ok = if req.greedy() {
            let y = argmax(i);
            if y != x {
                out[i] = y;
                ended = true;
                break;
            }
            true
        } else {
            if slots.draft.is_some() {
                dchecked = i + 1;
                dcheck(i, true)?;
            }
            let Some((_, Some((acc, res)))) = slots.sampled else {
                return Err(Error::invalid(
                    "verify",
                    "internal: missing sampled results",
                ));
            };
            if at(acc, r * k + i) == 0.0 {
                out[i] = at(res, r * k + i) as i64;
                ended = true;
                break;
            }
            true
        };
        if ok {
            out[i] = x;
            accepted += 1;
            if u32::try_from(x).is_ok_and(|x| plan.stops.binary_search(&x).is_ok()) {
                ended = true;
                break;
            }
        }
    }
    if !ended {
        checked = n + 1;
        tcheck(n)?;
        out[n] = if req.greedy() { argmax(n) } else { psample(n) };
    }
    for i in checked..=n {
        tcheck(i)?;
    }
    for i in dchecked..n {
        dcheck(i, false)?;
    }
    Ok((out, accepted))
}
