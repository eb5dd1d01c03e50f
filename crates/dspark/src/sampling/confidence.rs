//! The confidence head: `c_k = sigmoid(w·[h_k ; W1[x_{k-1}]] + b)` in f32, optionally calibrated
//! per position with STS (`sigmoid(z_k / T_k)`).

use super::fastmath::dot;
use super::sts::StsCalibration;
use super::view::{Floats, Rows3};
use crate::error::{Error, Result};
use crate::limits::output_elements;
use rayon::prelude::*;

use super::generic;
use super::par::worth_parallel;
use crate::device::{KernelPath, kernel_path};
use candle_core::{Device, Tensor};

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
/// With `DSPARK_KERNEL_PATH=tensor` ([`crate::device`]) the validated inputs are scored by the
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
    let [_, k_n, h] = hidden.dims;
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
    if path == KernelPath::Tensor {
        return generic_slices(hidden, prev_embeddings, &w, bias, sts, r);
    }
    let temps = temperatures(sts, k_n)?;
    let (wh, we) = w.split_at(h);
    let score = |buf: &mut Vec<f32>, i: usize| -> Result<f32> {
        hidden.data.read_into(i * h, buf);
        let mut z = dot(wh, buf);
        if let Some(e) = prev_embeddings {
            z += dot(we, &e[i * r..(i + 1) * r]);
        }
        // The weight is finite, so a non-finite score means a non-finite input (or an
        // overflow): reported, never turned into a confident 0 or 1.
        if !z.is_finite() {
            return Err(non_finite_row(
                buf,
                prev_embeddings.map(|e| &e[i * r..(i + 1) * r]),
                i,
                k_n,
            ));
        }
        let z = (z + bias) / temps[i % k_n];
        Ok(1.0 / (1.0 + (-z).exp()))
    };
    if worth_parallel(rows * (h + r)) {
        (0..rows)
            .into_par_iter()
            .map_init(|| vec![0f32; h], score)
            .collect()
    } else {
        let mut buf = vec![0f32; h];
        (0..rows).map(|i| score(&mut buf, i)).collect()
    }
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

/// [`confidence_slices`] through the device-generic tensor path (validated inputs, `rows > 0`):
/// the slices become CPU tensors (f16/bf16 kept as they are, widened by the tensor path).
fn generic_slices(
    hidden: Rows3<'_>,
    prev_embeddings: Option<&[f32]>,
    w: &[f32],
    bias: f32,
    sts: Option<&StsCalibration>,
    r: usize,
) -> Result<Vec<f32>> {
    let cpu = Device::Cpu;
    let dims = hidden.dims;
    let shape = (dims[0], dims[1], dims[2]);
    let t = match hidden.data {
        Floats::F32(v) => Tensor::from_slice(v, shape, &cpu)?,
        Floats::F16(v) => Tensor::from_slice(v, shape, &cpu)?,
        Floats::BF16(v) => Tensor::from_slice(v, shape, &cpu)?,
    };
    let prev = prev_embeddings
        .map(|e| Tensor::from_slice(e, (dims[0], dims[1], r), &cpu))
        .transpose()?;
    let head = generic::confidence::Head {
        weight: Tensor::from_slice(w, w.len(), &cpu)?,
        bias: Tensor::new(&[bias], &cpu)?,
        checked: true,
    };
    let out = generic::confidence::scores(
        &t,
        prev.as_ref(),
        &head,
        Geometry {
            rows: dims[0] * dims[1],
            r,
        },
        sts,
    )?;
    Ok(out.flatten_all()?.to_vec1::<f32>()?)
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
