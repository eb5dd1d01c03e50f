//! Verification where the logits are: the tensor-path kernel when they sit on a device (or
//! the tensor path is forced), the slice kernel in place on the host.

use candle_core::Tensor;

use crate::device::use_tensor_path;
use crate::error::{Error, Result};
use crate::sampling::{
    Floats, PerRequest, Rows3, Seeds, Tokens, Verification, VerifyOptions, verify, verify_slices,
};
use crate::view::with_floats;

/// Rows `act` of a `[B, ..]` tensor (the tensor itself when every row is active).
pub(crate) fn select_rows(t: &Tensor, act: &[usize], b: usize) -> Result<Tensor> {
    if t.dims().first() != Some(&b) {
        return Err(Error::bad_shape(
            "target.forward",
            format!("returned logits of shape {:?} for a batch of {b}", t.dims()),
        ));
    }
    if act.len() == b {
        return Ok(t.clone());
    }
    let idx: Vec<u32> = act.iter().map(|&i| i as u32).collect();
    let idx = Tensor::from_vec(idx, act.len(), t.device())?;
    Ok(t.index_select(&idx, 0)?)
}

/// Verify `drafts` (`[B, k]` ids, row-major) against `logits` `[B, k + 1, V]` where the
/// logits are: on a device (or under the forced tensor path) with the tensor-path kernel, the
/// drafts and the `[B, k, V]` draft logits `q` going to them (a device drafter's are there
/// already) and only the verdicts coming back; on the host with the slice kernel over the
/// logits in place.
pub(crate) fn verify_where(
    logits: &Tensor,
    vocab: usize,
    drafts: Vec<i64>,
    k: usize,
    q: Option<Tensor>,
    options: &VerifyOptions,
) -> Result<Verification> {
    let b = logits.dims().first().copied().unwrap_or(0);
    let q_ok = q.as_ref().is_none_or(|q| q.dims() == [b, k, vocab]);
    if logits.dims() != [b, k + 1, vocab] || drafts.len() != b * k || !q_ok {
        return Err(Error::bad_shape(
            "target.forward",
            format!(
                "logits of shape {:?} (draft logits {:?}) for {} drafts in rows of {k} over a \
                 vocabulary of {vocab}",
                logits.dims(),
                q.as_ref().map(Tensor::dims),
                drafts.len()
            ),
        ));
    }
    if use_tensor_path(logits.device())? {
        let dev = logits.device();
        let drafts = Tensor::from_vec(drafts, (b, k), dev)?;
        let q = match q {
            Some(q) => Some(q.to_device(dev)?),
            None => None,
        };
        return verify(logits, &drafts, q.as_ref(), options);
    }
    let host = |q: Option<Floats<'_>>| {
        with_floats(logits, "target logits", |p| {
            verify_slices(
                Rows3 {
                    data: p,
                    dims: [b, k + 1, vocab],
                },
                Tokens {
                    data: &drafts,
                    dims: [b, k],
                },
                q.map(|q| Rows3 {
                    data: q,
                    dims: [b, k, vocab],
                }),
                options,
            )
        })
    };
    match q {
        None => host(None),
        Some(q) => with_floats(&q, "draft logits", |q| host(Some(q))),
    }
}

/// Whether `e` is a failure of some request's own rows (NaN or infinite logits, a row without
/// a finite value): the kind of error that ends that request alone.
pub(crate) fn row_fault(e: &Error) -> bool {
    match e {
        Error::NonFinite { .. } => true,
        Error::InvalidArgument { name, .. } => {
            matches!(
                name.as_str(),
                "target_logits" | "draft_logits" | "base_logits"
            )
        }
        _ => false,
    }
}

/// Request `j`'s part of per-request verify options (`None` for a scalar seed, whose streams
/// are keyed by the row: the engine's are always per request).
fn one_request(o: &VerifyOptions, j: usize) -> Option<VerifyOptions> {
    fn pick<T: Clone>(p: &PerRequest<T>, j: usize) -> PerRequest<T> {
        match p {
            PerRequest::All(v) => PerRequest::All(v.clone()),
            PerRequest::Each(v) => PerRequest::Each(vec![v[j].clone()]),
        }
    }
    Some(VerifyOptions {
        temperature: pick(&o.temperature, j),
        top_k: pick(&o.top_k, j),
        top_p: pick(&o.top_p, j),
        seeds: match &o.seeds {
            Seeds::PerRequest(v) => Seeds::PerRequest(vec![v[j]]),
            Seeds::Scalar(_) => return None,
        },
        num_draft: o.num_draft.as_ref().map(|n| vec![n[j]]),
        stop_token_ids: o.stop_token_ids.clone(),
    })
}

/// [`verify_where`], and when a request's own rows fail their checks, that request alone
/// fails: every request is then verified on its own (its draws depend on its own seed and
/// positions only, so the others' results are the batch's), and the returned list holds the
/// error of each request that failed (its row of the verification is all `-1`).
pub(crate) fn verify_isolating(
    logits: &Tensor,
    vocab: usize,
    drafts: Vec<i64>,
    k: usize,
    q: Option<Tensor>,
    options: &VerifyOptions,
) -> Result<(Verification, Vec<Option<Error>>)> {
    let b = logits.dims().first().copied().unwrap_or(0);
    // The drafts are B·K ids and `q` a handle: keeping them for a retry costs nothing that
    // shows in a round.
    let first = verify_where(logits, vocab, drafts.clone(), k, q.clone(), options);
    let singles: Vec<VerifyOptions> = match first {
        Ok(v) => return Ok((v, (0..b).map(|_| None).collect())),
        Err(e) if row_fault(&e) && b == 1 => return Ok((failed_rows(1, k), vec![Some(e)])),
        Err(e) if row_fault(&e) => match (0..b).map(|j| one_request(options, j)).collect() {
            Some(singles) => singles,
            None => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let mut out = failed_rows(b, k);
    let mut faults = Vec::with_capacity(b);
    for j in 0..b {
        let lj = logits.narrow(0, j, 1)?;
        let qj = match &q {
            Some(q) => Some(q.narrow(0, j, 1)?),
            None => None,
        };
        let dj = drafts[j * k..(j + 1) * k].to_vec();
        match verify_where(&lj, vocab, dj, k, qj, &singles[j]) {
            Ok(v) => {
                out.tokens[j * (k + 1)..(j + 1) * (k + 1)].copy_from_slice(&v.tokens);
                out.num_accepted[j] = v.num_accepted[0];
                faults.push(None);
            }
            Err(e) if row_fault(&e) => faults.push(Some(e)),
            Err(e) => return Err(e),
        }
    }
    Ok((out, faults))
}

/// A verification of `b` requests in which nothing was emitted.
fn failed_rows(b: usize, k: usize) -> Verification {
    Verification {
        batch: b,
        width: k + 1,
        tokens: vec![-1; b * (k + 1)],
        num_accepted: vec![0; b],
    }
}
