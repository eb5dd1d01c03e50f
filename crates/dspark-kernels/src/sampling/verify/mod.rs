//! Lossless speculative verification (rejection sampling), per request and prefix-cumulative.
//!
//! Per request `r` with `n` drafts: for `i < n`, draft `x_i` is accepted iff `u·q_i(x_i) < p_i(x_i)`
//! (`q` one-hot when no draft logits are given; greedy requests: iff `x_i` is the target argmax).
//! At the first reject we draw from `norm(max(p_i − q_i, 0))` (or `p_i` if that is empty;
//! greedy: the argmax). If all `n` are accepted, a bonus token comes from row `n`. An accepted stop
//! token ends the round without a bonus.
//!
//! `request.rs` holds the options, the outcome and the validation every path shares
//! ([`prepare`]); `mod.rs` the entry points; `cpu.rs` is the host slice kernel (the reference), `device.rs` the device-generic
//! tensor kernel, `residual.rs` the residual draw of the host kernel.

mod cpu;
mod device;
pub(crate) mod request;
mod residual;

#[cfg(feature = "cuda")]
use request::prepare_params;
pub(crate) use request::{HostRows, Plan, Request, prepare};
pub use request::{Verification, VerifyOptions};

use candle_core::{Device, Tensor};

use super::args::{check_ids, dims, ids};
use super::categorical::Check;
use super::dist::{Scope, check_row};
use super::transfer::{self, check_float};
use crate::device::{KernelPath, kernel_path, same_device, use_fused, use_tensor_path};
use crate::error::Result;
use crate::view::{Rows3, Tokens, with_floats};

/// Verify a batch of drafts against target logits `[B, K+1, V]` (any of f32/f16/bf16).
///
/// `draft_tokens` is `[B, K]` target ids (a transposed `[K, B]` is a `bad-shape` error);
/// `draft_logits` (optional) is `[B, K, V]` with `softmax(row) = q`, the exact distribution
/// each draft was sampled from. The output (`[B, K+1]` ids) is bounded by
/// [`crate::limits::MAX_OUTPUT_ELEMENTS`] (`too-large`).
pub fn verify_slices(
    target: Rows3<'_>,
    draft_tokens: Tokens<'_>,
    draft_logits: Option<Rows3<'_>>,
    opts: &VerifyOptions,
) -> Result<Verification> {
    let on = match kernel_path()? {
        KernelPath::Fast => None,
        KernelPath::Tensor => Some(Device::Cpu),
        KernelPath::Fused => return verify_slices_fused(target, draft_tokens, draft_logits, opts),
    };
    verify_slices_on(on.as_ref(), target, draft_tokens, draft_logits, opts)
}

/// [`verify_slices`] by the model of the fused kernels ([`crate::sampling::fused`]), whatever
/// [`crate::device::KERNEL_PATH_ENV`] says: the same validation and errors, the same greedy
/// results, sampled ones equal for the same seeds but where summation order moves a boundary.
pub fn verify_slices_fused(
    target: Rows3<'_>,
    draft_tokens: Tokens<'_>,
    draft_logits: Option<Rows3<'_>>,
    opts: &VerifyOptions,
) -> Result<Verification> {
    if !super::fused::fits_verify(target.dims[2]) {
        return verify_slices_on(Some(&Device::Cpu), target, draft_tokens, draft_logits, opts);
    }
    let plan = check_slices(target, draft_tokens, draft_logits, opts)?;
    super::fused::verify_host(
        &plan,
        HostRows::new(target, draft_tokens.data, draft_logits),
    )
}

/// [`verify_slices`] on an explicit kernel path: `None` runs the host slice kernel (whatever
/// [`crate::device::KERNEL_PATH_ENV`] says), `Some(device)` the device-generic tensor kernel on
/// `device` (the inputs are uploaded there). Validation and results are the same on both.
pub fn verify_slices_on(
    device: Option<&Device>,
    target: Rows3<'_>,
    draft_tokens: Tokens<'_>,
    draft_logits: Option<Rows3<'_>>,
    opts: &VerifyOptions,
) -> Result<Verification> {
    let plan = check_slices(target, draft_tokens, draft_logits, opts)?;
    // An empty batch has nothing to upload (its dims may not even form a tensor shape).
    if let Some(dev) = device.filter(|_| plan.dims[0] > 0) {
        let upload = |r: Rows3<'_>| transfer::upload(r.data, &r.dims, dev);
        let t = upload(target)?;
        let d = draft_logits.map(upload).transpose()?;
        return device::verify_tensors(&plan, &t, draft_tokens.data, d.as_ref());
    }
    cpu::run(
        &plan,
        HostRows::new(target, draft_tokens.data, draft_logits),
    )
}

/// The checks of the slice entries: each view's size against its shape, then [`prepare`].
fn check_slices(
    target: Rows3<'_>,
    draft_tokens: Tokens<'_>,
    draft_logits: Option<Rows3<'_>>,
    opts: &VerifyOptions,
) -> Result<Plan> {
    target.check("target_logits")?;
    draft_tokens.check("draft_tokens")?;
    if let Some(d) = &draft_logits {
        d.check("draft_logits")?;
    }
    prepare(
        target.dims,
        draft_tokens,
        draft_logits.map(|d| d.dims),
        opts,
    )
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
    check_ids(draft_tokens, "draft_tokens")?;
    let tokd = dims::<2>(draft_tokens, "draft_tokens", "[B, K]")?;
    #[cfg(feature = "cuda")]
    if target.device().is_cuda() && use_fused(target.device())? && super::fused::fits_verify(td[2])
    {
        return verify_cuda_fused(target, draft_tokens, tokd, draft_logits, opts);
    }
    let toks = ids(draft_tokens, "draft_tokens")?;
    let toks = Tokens {
        data: &toks,
        dims: tokd,
    };
    let fused = use_fused(target.device())? && super::fused::fits_verify(td[2]);
    if use_tensor_path(target.device())? && !fused {
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
        return device::verify_tensors(&plan, target, toks.data, draft_logits);
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

/// [`verify`] on a CUDA device by the fused kernels: the logits read where they are, the draft
/// ids too when they are on the device (checked there), else uploaded once.
#[cfg(feature = "cuda")]
fn verify_cuda_fused(
    target: &Tensor,
    draft_tokens: &Tensor,
    tokd: [usize; 2],
    draft_logits: Option<&Tensor>,
    opts: &VerifyOptions,
) -> Result<Verification> {
    use super::fused::TokenSource;
    use super::fused::layout::TokenKind;
    let dev = target.device();
    let td = dims::<3>(target, "target_logits", "[B, K+1, V]")?;
    check_float(target, "target_logits")?;
    let dd = match draft_logits {
        Some(d) => {
            same_device(dev, &[("draft_logits", d)])?;
            check_float(d, "draft_logits")?;
            Some(dims::<3>(d, "draft_logits", "[B, K, V]")?)
        }
        None => None,
    };
    let kind = match draft_tokens.dtype() {
        candle_core::DType::I64 => Some(TokenKind::I64),
        candle_core::DType::U32 => Some(TokenKind::U32),
        candle_core::DType::I32 => Some(TokenKind::I32),
        _ => None,
    };
    let on_device = draft_tokens.device().same_device(dev) && kind.is_some();
    if !on_device {
        // Host (or unusual) ids: validated on the host with the rest, uploaded by the call.
        let toks = ids(draft_tokens, "draft_tokens")?;
        let t = Tokens {
            data: &toks,
            dims: tokd,
        };
        let plan = prepare(td, t, dd, opts)?;
        return super::fused::verify_cuda(
            dev,
            &plan,
            target,
            TokenSource::Host(&toks),
            draft_logits,
        );
    }
    let plan = match prepare_params(td, tokd, dd, opts) {
        Ok(plan) => plan,
        Err(_) => {
            // A bad setting: the fast path's first error may be an earlier request's draft
            // id, so the ids come to the host for the full checks (errors only).
            let toks = ids(draft_tokens, "draft_tokens")?;
            let t = Tokens {
                data: &toks,
                dims: tokd,
            };
            prepare(td, t, dd, opts)?;
            return Err(crate::error::Error::Internal {
                message: "verify: the settings failed their checks only without the draft ids"
                    .into(),
            });
        }
    };
    let toks = draft_tokens.contiguous()?;
    let source = TokenSource::Device {
        addr: crate::cuda_interop::device_ptr(&toks)?,
        kind: kind.unwrap_or(TokenKind::I64),
    };
    super::fused::verify_cuda(dev, &plan, target, source, draft_logits)
}

pub(crate) fn greedy_check(st: &Check, where_: impl Fn() -> String) -> Result<()> {
    let (nan, empty) = (st.non_finite(), !st.has_finite());
    check_row("target_logits", nan, empty, Scope::Masked, where_)
}
