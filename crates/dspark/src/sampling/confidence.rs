//! The confidence head: `c_k = sigmoid(w·[h_k ; W1[x_{k-1}]] + b)` in f32, optionally calibrated
//! per position with STS (`sigmoid(z_k / T_k)`).

use super::fastmath::dot;
use super::sts::StsCalibration;
use super::view::{Floats, Rows3};
use crate::error::{Error, Result};
use crate::limits::output_elements;
use rayon::prelude::*;

use super::par::worth_parallel;

/// Confidences `[B·K]` from hidden states `[B, K, H]`, optional previous-token Markov embeddings
/// `[B·K·r]` (as in [`super::DraftBlock::prev_embeddings`]), a weight of shape `[H (+ r)]` or
/// `[1, H (+ r)]` (`weight_shape`; any other shape is `bad-shape`, even with the right count)
/// and a bias.
///
/// Errors: `bad-shape`, `too-large` (`B·K` above [`crate::limits::MAX_OUTPUT_ELEMENTS`]),
/// `non-finite` (NaN or ±inf in the weight or bias; in the hidden states or embeddings, found
/// as a non-finite score, so it costs no extra pass), `invalid-argument` (an STS table shorter
/// than `K`).
pub fn confidence_slices(
    hidden: Rows3<'_>,
    prev_embeddings: Option<&[f32]>,
    weight: Floats<'_>,
    weight_shape: &[usize],
    bias: f32,
    sts: Option<&StsCalibration>,
) -> Result<Vec<f32>> {
    hidden.check("hidden")?;
    let [b_n, k_n, h] = hidden.dims;
    let rows = output_elements("hidden", &[b_n as u64, k_n as u64])?;
    let n = match weight_shape {
        [n] | [1, n] if *n == weight.len() => *n,
        _ => {
            return Err(Error::bad_shape(
                "weight",
                format!(
                    "shape {weight_shape:?} with {} values, expected [H (+ r)] or [1, H (+ r)]",
                    weight.len()
                ),
            ));
        }
    };
    let r = match prev_embeddings {
        None => {
            if n != h {
                return Err(Error::bad_shape(
                    "weight",
                    format!("{n} values, expected H = {h} (no Markov embeddings given)"),
                ));
            }
            0
        }
        Some(e) => {
            let Some(r) = n.checked_sub(h) else {
                return Err(Error::bad_shape(
                    "weight",
                    format!("{n} values, fewer than H = {h}"),
                ));
            };
            if rows.checked_mul(r) != Some(e.len()) {
                return Err(Error::bad_shape(
                    "prev_embeddings",
                    format!(
                        "{} values, expected B·K·r = {rows}·{r} (r = weight len − H)",
                        e.len()
                    ),
                ));
            }
            r
        }
    };
    if h + r == 0 && rows > 0 {
        // No features: the output would not be bounded by the input.
        return Err(Error::bad_shape(
            "hidden",
            format!(
                "dims {:?}: the hidden size H must be at least 1",
                hidden.dims
            ),
        ));
    }
    if !bias.is_finite() {
        return Err(Error::NonFinite {
            name: "bias".into(),
            message: format!("{bias}"),
        });
    }
    let mut w = vec![0f32; h + r];
    weight.read_into(0, &mut w);
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Err(Error::NonFinite {
            name: "weight".into(),
            message: format!("{} at index {i}", w[i]),
        });
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    let temps: Vec<f32> = match sts {
        Some(s) => (0..k_n).map(|k| s.temperature(k)).collect::<Result<_>>()?,
        None => vec![1.0; k_n],
    };
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

/// The `non-finite` error of row `i` (request `i / K`, slot `i % K`), naming the input that
/// holds a NaN or infinity (or the overflow, when both are finite).
fn non_finite_row(hidden: &[f32], prev: Option<&[f32]>, i: usize, k_n: usize) -> Error {
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
