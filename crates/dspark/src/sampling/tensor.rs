//! Thin candle-`Tensor` fronts over the slice kernels.
//!
//! CPU tensors that are already contiguous are read in place (no copy); others are copied to a
//! contiguous CPU buffer first. Results come back as plain vectors (or a CPU→device tensor).
//! `verify` and `sample_block` run the device-generic kernels instead for tensors that take the
//! tensor path ([`crate::device::use_tensor_path`]): off the CPU, or on it when forced; the
//! logits then stay where they are and only ids and a few numbers per row come back.

use super::confidence::confidence_slices;
use super::generic::markov::{DeviceBlock, sample_block_tensors};
use super::generic::transfer::check_float;
use super::generic::verify::verify_tensors;
use super::markov::{BlockOptions, DraftBlock, sample_block_slices};
use super::markov_check::validate_dims;
use super::sts::StsCalibration;
use super::verify::{Verification, VerifyOptions, prepare, verify_slices};
use super::view::{Floats, Mat, Rows3, Tokens};
use crate::device::{same_device, use_tensor_path};
use crate::error::{Error, Result};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

fn on_cpu(t: &Tensor) -> Result<Tensor> {
    let t = if t.device().is_cpu() {
        t.clone()
    } else {
        t.to_device(&Device::Cpu)?
    };
    Ok(t.contiguous()?)
}

/// Run `f` on a borrowed view of `t`'s values (f32, f16 or bf16).
fn with_floats<R>(t: &Tensor, name: &str, f: impl FnOnce(Floats<'_>) -> Result<R>) -> Result<R> {
    let t = on_cpu(t)?;
    let (storage, layout) = t.storage_and_layout();
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| Error::bad_shape(name, "not contiguous after a contiguous copy"))?;
    let unsupported = |dtype: DType| Error::UnsupportedDtype {
        name: name.to_string(),
        message: format!("{dtype:?} (need f32, f16 or bf16)"),
    };
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(Floats::F32(&v[start..end])),
        Storage::Cpu(CpuStorage::F16(v)) => f(Floats::F16(&v[start..end])),
        Storage::Cpu(CpuStorage::BF16(v)) => f(Floats::BF16(&v[start..end])),
        Storage::Cpu(other) => Err(unsupported(other.dtype())),
        _ => Err(Error::invalid(
            name,
            "tensor is not on the CPU after moving it there",
        )),
    }
}

fn dims<const N: usize>(t: &Tensor, name: &str, what: &str) -> Result<[usize; N]> {
    <[usize; N]>::try_from(t.dims())
        .map_err(|_| Error::bad_shape(name, format!("shape {:?}, expected {what}", t.dims())))
}

/// Token ids of an integer tensor (u8/u32/i64), flattened.
fn ids(t: &Tensor, name: &str) -> Result<Vec<i64>> {
    match t.dtype() {
        DType::U8 | DType::U32 | DType::I64 => {}
        other => {
            return Err(Error::UnsupportedDtype {
                name: name.into(),
                message: format!("{other:?} (need an integer dtype: u8, u32 or i64)"),
            });
        }
    }
    Ok(t.flatten_all()?
        .to_dtype(DType::I64)?
        .to_device(&Device::Cpu)?
        .to_vec1::<i64>()?)
}

/// Tensor front of [`sample_block_slices`]: `base` `[B, K, V_d]`, `w1` `[V_in, r]`, `w2`
/// `[V_d, r]` (f32/f16/bf16), `anchors` `[B]` integer target ids.
pub fn sample_block(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &Tensor,
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let bd = dims::<3>(base, "base_logits", "[B, K, V_d]")?;
    let d1 = dims::<2>(w1, "markov_w1", "[V_in, r]")?;
    let d2 = dims::<2>(w2, "markov_w2", "[V_d, r]")?;
    let a = ids(anchors, "anchors")?;
    dims::<1>(anchors, "anchors", "[B]")?;
    let a: Vec<u32> = a
        .iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| Error::TokenOutOfRange {
                name: "anchors".into(),
                id: x,
                vocab_size: d1[0],
            })
        })
        .collect::<Result<_>>()?;
    if use_tensor_path(base.device())? {
        return block_on_device(base, w1, w2, &a, opts)?.to_host();
    }
    with_floats(base, "base_logits", |b| {
        with_floats(w1, "markov_w1", |m1| {
            with_floats(w2, "markov_w2", |m2| {
                sample_block_slices(
                    Rows3 { data: b, dims: bd },
                    Mat { data: m1, dims: d1 },
                    Mat { data: m2, dims: d2 },
                    &a,
                    opts,
                )
            })
        })
    })
}

fn block_on_device(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DeviceBlock> {
    let bd = dims::<3>(base, "base_logits", "[B, K, V_d]")?;
    let d1 = dims::<2>(w1, "markov_w1", "[V_in, r]")?;
    let d2 = dims::<2>(w2, "markov_w2", "[V_d, r]")?;
    let dev = base.device();
    same_device(dev, &[("markov_w1", w1), ("markov_w2", w2)])?;
    check_float(base, "base_logits")?;
    check_float(w1, "markov_w1")?;
    check_float(w2, "markov_w2")?;
    let g = validate_dims(bd, d1, d2, anchors, opts)?;
    let streams = opts.seeds.streams(g.batch, "seeds")?;
    sample_block_tensors(&g, &streams, base, w1, w2, anchors, opts)
}

/// [`sample_block`] on the device-generic path whatever the device, with the `[B, K, V_t]`
/// draft logits and the embeddings left on `base`'s device (only the tokens come back):
/// `anchors` are `B` target ids.
pub fn sample_block_on_device(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DeviceBlock> {
    block_on_device(base, w1, w2, anchors, opts)
}

/// Tensor front of [`verify_slices`]: `target` `[B, K+1, V]`, `draft_tokens` `[B, K]` integer
/// ids, `draft_logits` `[B, K, V]`.
pub fn verify(
    target: &Tensor,
    draft_tokens: &Tensor,
    draft_logits: Option<&Tensor>,
    opts: &VerifyOptions,
) -> Result<Verification> {
    let td = dims::<3>(target, "target_logits", "[B, K+1, V]")?;
    let toks = ids(draft_tokens, "draft_tokens")?;
    let tokd = dims::<2>(draft_tokens, "draft_tokens", "[B, K]")?;
    let toks = Tokens {
        data: &toks,
        dims: tokd,
    };
    if use_tensor_path(target.device())? {
        let dev = target.device();
        check_float(target, "target_logits")?;
        let dd = match draft_logits {
            Some(d) => {
                same_device(dev, &[("draft_logits", d)])?;
                let dd = dims::<3>(d, "draft_logits", "[B, K, V]")?;
                check_float(d, "draft_logits")?;
                Some(dd)
            }
            None => None,
        };
        let plan = prepare(td, toks, dd, opts)?;
        return verify_tensors(&plan, target, toks.data, draft_logits);
    }
    with_floats(target, "target_logits", |t| {
        let t = Rows3 { data: t, dims: td };
        match draft_logits {
            None => verify_slices(t, toks, None, opts),
            Some(d) => {
                let dd = dims::<3>(d, "draft_logits", "[B, K, V]")?;
                with_floats(d, "draft_logits", |dl| {
                    verify_slices(t, toks, Some(Rows3 { data: dl, dims: dd }), opts)
                })
            }
        }
    })
}

/// Tensor front of [`confidence_slices`]: `hidden` `[B, K, H]`, `prev_embeddings` `[B, K, r]`,
/// `weight` `[H(+r)]` or `[1, H(+r)]`, `bias` one value. Returns `[B, K]` f32 on `hidden`'s
/// device.
///
/// Off the CPU (and on it with `DSPARK_KERNEL_PATH=tensor`, see [`crate::device`]) the head runs
/// as tensor operations where the inputs are, with the same errors (`device-mismatch` for an
/// argument on another device); nothing but one scalar check is copied to the host.
pub fn confidence(
    hidden: &Tensor,
    prev_embeddings: Option<&Tensor>,
    weight: &Tensor,
    bias: Option<&Tensor>,
    sts: Option<&StsCalibration>,
) -> Result<Tensor> {
    if crate::device::use_tensor_path(hidden.device())? {
        return super::generic::confidence::confidence_tensor(
            hidden,
            prev_embeddings,
            weight,
            bias,
            sts,
        );
    }
    let hd = dims::<3>(hidden, "hidden", "[B, K, H]")?;
    let b = match bias {
        None => 0.0,
        Some(t) => {
            let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            match v.as_slice() {
                [x] => *x,
                _ => {
                    return Err(Error::bad_shape(
                        "bias",
                        format!("{} values, expected 1", v.len()),
                    ));
                }
            }
        }
    };
    let prev = match prev_embeddings {
        None => None,
        Some(t) => {
            let pd = dims::<3>(t, "prev_embeddings", "[B, K, r]")?;
            if pd[..2] != hd[..2] {
                return Err(Error::bad_shape(
                    "prev_embeddings",
                    format!(
                        "shape {pd:?} does not match hidden's [B, K] = {:?}",
                        &hd[..2]
                    ),
                ));
            }
            Some(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
        }
    };
    let wd = weight.dims().to_vec();
    let out = with_floats(hidden, "hidden", |h| {
        with_floats(weight, "weight", |w| {
            confidence_slices(Rows3 { data: h, dims: hd }, prev.as_deref(), w, &wd, b, sts)
        })
    })?;
    Ok(Tensor::from_vec(out, (hd[0], hd[1]), &Device::Cpu)?.to_device(hidden.device())?)
}
