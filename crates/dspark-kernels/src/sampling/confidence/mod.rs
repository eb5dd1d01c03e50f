//! The confidence head: `c_k = sigmoid(w·[h_k ; W1[x_{k-1}]] + b)` in f32, optionally calibrated
//! per position with STS (`sigmoid(z_k / T_k)`).
//!
//! `mod.rs` holds the validation every path shares and the entry points; `cpu.rs` is the host
//! scoring loop (the reference), `device.rs` the tensor path. The STS table is a file format,
//! read in `config::sts`.

mod cpu;
mod device;

pub use crate::config::StsCalibration;

use candle_core::{DType, Device, Tensor};

use super::args::dims;
use crate::device::{KernelPath, kernel_path};
use crate::error::{Error, Result};
use crate::limits::output_elements;
use crate::view::{Floats, Rows3, with_floats};

/// Confidences `[B·K]` from hidden states `[B, K, H]`, optional previous-token Markov embeddings
/// `[B·K·r]` (as in [`super::DraftBlock::prev_embeddings`]), a weight of shape `[H (+ r)]` or
/// `[1, H (+ r)]` (`weight_shape`; any other shape is `bad-shape`, even with the right count)
/// and a bias.
///
/// Errors: `bad-shape`, `too-large` (`B·K` above [`crate::limits::MAX_OUTPUT_ELEMENTS`]),
/// `non-finite` (NaN or ±inf in the weight or bias; in the hidden states or embeddings, found
/// as a non-finite score, so it costs no extra pass), `invalid-argument` (an STS table shorter
/// than `K`).
///
/// With `DSPARK_KERNEL_PATH=tensor` or `fused` ([`crate::device`]) the validated inputs are scored by the
/// device-generic tensor path (the one CUDA tensors take), with the same results to float
/// rounding and the same errors; an invalid value of the variable is `invalid-argument`.
pub fn confidence_slices(
    hidden: Rows3<'_>,
    prev_embeddings: Option<&[f32]>,
    weight: Floats<'_>,
    weight_shape: &[usize],
    bias: f32,
    sts: Option<&StsCalibration>,
) -> Result<Vec<f32>> {
    let path = kernel_path()?;
    hidden.check("hidden")?;
    let h = hidden.dims[2];
    let Geometry { rows, r } = geometry(
        hidden.dims,
        prev_embeddings.map(<[f32]>::len),
        weight.len(),
        weight_shape,
    )?;
    check_bias(bias)?;
    let mut w = vec![0f32; h + r];
    weight.read_into(0, &mut w);
    check_weight(&w)?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    let call = Scoring {
        hidden,
        prev: prev_embeddings,
        w: &w,
        bias,
        sts,
        r,
    };
    if path != KernelPath::Fast {
        // The tensor path (the fused path has no kernel of its own for the head).
        return device::score_slices(&call);
    }
    cpu::score(&call)
}

/// A validated slice call (at least one row): `hidden` `[B, K, H]`, `prev` its `[B·K·r]`
/// Markov embeddings, `w` the `[H + r]` weight (checked finite), the bias (checked finite) and
/// the STS table.
#[derive(Clone, Copy)]
pub(crate) struct Scoring<'a> {
    pub(crate) hidden: Rows3<'a>,
    pub(crate) prev: Option<&'a [f32]>,
    pub(crate) w: &'a [f32],
    pub(crate) bias: f32,
    pub(crate) sts: Option<&'a StsCalibration>,
    pub(crate) r: usize,
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
        return device::confidence_tensor(hidden, prev_embeddings, weight, bias, sts);
    }
    let hd = hidden_dims(hidden)?;
    let b = match bias {
        None => 0.0,
        Some(t) => one_value(t)?
            .to_dtype(DType::F32)?
            .squeeze(0)?
            .to_scalar::<f32>()?,
    };
    let prev = match prev_embeddings {
        None => None,
        Some(t) => {
            check_prev(t, hd)?;
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

/// `hidden`'s dims `[B, K, H]`, or `bad-shape`.
pub(crate) fn hidden_dims(hidden: &Tensor) -> Result<[usize; 3]> {
    dims::<3>(hidden, "hidden", "[B, K, H]")
}

/// `bad-shape` unless `prev` is `[B, K, r]` over the `[B, K]` of the hidden dims `hd`.
pub(crate) fn check_prev(prev: &Tensor, hd: [usize; 3]) -> Result<()> {
    let pd = dims::<3>(prev, "prev_embeddings", "[B, K, r]")?;
    if pd[..2] != hd[..2] {
        return Err(Error::bad_shape(
            "prev_embeddings",
            format!(
                "shape {pd:?} does not match hidden's [B, K] = {:?}",
                &hd[..2]
            ),
        ));
    }
    Ok(())
}

/// The bias tensor flattened to its one value, or `bad-shape`.
pub(crate) fn one_value(bias: &Tensor) -> Result<Tensor> {
    if bias.elem_count() != 1 {
        return Err(Error::bad_shape(
            "bias",
            format!("{} values, expected 1", bias.elem_count()),
        ));
    }
    Ok(bias.flatten_all()?)
}

/// The validated shape of one confidence call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    /// `B·K`.
    pub(crate) rows: usize,
    /// Markov features per row (`weight len − H`; 0 without embeddings).
    pub(crate) r: usize,
}

/// Check hidden dims `[B, K, H]`, the number of Markov embedding values (`None`: not given)
/// and the weight's length and shape; the errors of [`confidence_slices`].
pub(crate) fn geometry(
    dims: [usize; 3],
    prev_len: Option<usize>,
    weight_len: usize,
    weight_shape: &[usize],
) -> Result<Geometry> {
    let [b_n, k_n, h] = dims;
    let rows = output_elements("hidden", &[b_n as u64, k_n as u64])?;
    let n = match weight_shape {
        [n] | [1, n] if *n == weight_len => *n,
        _ => {
            return Err(Error::bad_shape(
                "weight",
                format!(
                    "shape {weight_shape:?} with {weight_len} values, expected [H (+ r)] or \
                     [1, H (+ r)]"
                ),
            ));
        }
    };
    let r = match prev_len {
        None => {
            if n != h {
                return Err(Error::bad_shape(
                    "weight",
                    format!("{n} values, expected H = {h} (no Markov embeddings given)"),
                ));
            }
            0
        }
        Some(len) => {
            let Some(r) = n.checked_sub(h) else {
                return Err(Error::bad_shape(
                    "weight",
                    format!("{n} values, fewer than H = {h}"),
                ));
            };
            if rows.checked_mul(r) != Some(len) {
                return Err(Error::bad_shape(
                    "prev_embeddings",
                    format!("{len} values, expected B·K·r = {rows}·{r} (r = weight len − H)"),
                ));
            }
            r
        }
    };
    if h + r == 0 && rows > 0 {
        // No features: the output would not be bounded by the input.
        return Err(Error::bad_shape(
            "hidden",
            format!("dims {dims:?}: the hidden size H must be at least 1"),
        ));
    }
    Ok(Geometry { rows, r })
}

/// `non-finite` naming `bias` unless it is finite.
pub(crate) fn check_bias(bias: f32) -> Result<()> {
    if bias.is_finite() {
        return Ok(());
    }
    Err(Error::NonFinite {
        name: "bias".into(),
        message: format!("{bias}"),
    })
}

/// `non-finite` naming `weight` and the first bad index, unless every value is finite.
pub(crate) fn check_weight(w: &[f32]) -> Result<()> {
    match w.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::NonFinite {
            name: "weight".into(),
            message: format!("{} at index {i}", w[i]),
        }),
    }
}

/// `T_k` for slots `0..K` (all `1` without STS); `invalid-argument` for a short table.
pub(crate) fn temperatures(sts: Option<&StsCalibration>, k_n: usize) -> Result<Vec<f32>> {
    match sts {
        Some(s) => (0..k_n).map(|k| s.temperature(k)).collect(),
        None => Ok(vec![1.0; k_n]),
    }
}

/// The `non-finite` error of row `i` (request `i / K`, slot `i % K`), naming the input that
/// holds a NaN or infinity (or the overflow, when both are finite).
pub(crate) fn non_finite_row(hidden: &[f32], prev: Option<&[f32]>, i: usize, k_n: usize) -> Error {
    let at = format!("request {}, slot {}", i / k_n, i % k_n);
    let bad = |x: &[f32]| x.iter().find(|v| !v.is_finite()).copied();
    let (name, message) = if let Some(v) = bad(hidden) {
        ("hidden", format!("{v} in {at}"))
    } else if let Some(v) = prev.and_then(bad) {
        ("prev_embeddings", format!("{v} in {at}"))
    } else {
        ("hidden", format!("the score of {at} overflows f32"))
    };
    Error::NonFinite {
        name: name.into(),
        message,
    }
}
