//! Verification where the logits are: the tensor-path kernel when they sit on a device (or
//! the tensor path is forced), the slice kernel in place on the host.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use crate::device::use_tensor_path;
use crate::error::{Error, Result};
use crate::sampling::{Floats, Rows3, Tokens, Verification, VerifyOptions, verify, verify_slices};

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
        with_floats(logits, |p| {
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
        })?
    };
    match q {
        None => host(None),
        Some(q) => with_floats(&q, |q| host(Some(q)))?,
    }
}

/// Run `f` over the values of `t` as host floats: borrowed when `t` is a contiguous f32 / f16
/// / bf16 CPU tensor, else copied to the host as f32 once.
pub(crate) fn with_floats<R>(t: &Tensor, f: impl FnOnce(Floats<'_>) -> R) -> Result<R> {
    let t = if t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?
    };
    let (storage, layout) = t.storage_and_layout();
    let Some((lo, hi)) = layout.contiguous_offsets() else {
        drop(storage);
        let c = t.contiguous()?;
        return with_floats(&c, f);
    };
    Ok(match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(Floats::F32(&v[lo..hi])),
        Storage::Cpu(CpuStorage::F16(v)) => f(Floats::F16(&v[lo..hi])),
        Storage::Cpu(CpuStorage::BF16(v)) => f(Floats::BF16(&v[lo..hi])),
        _ => {
            return Err(Error::Internal {
                message: "host floats: unexpected storage after conversion".into(),
            });
        }
    })
}
