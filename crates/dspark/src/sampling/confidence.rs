//! The confidence head: `c_k = sigmoid(w·[h_k ; W1[x_{k-1}]] + b)` in f32, optionally calibrated
//! per position with STS (`sigmoid(z_k / T_k)`).

use super::fastmath::dot;
use super::sts::StsCalibration;
use super::view::{Floats, Rows3};
use crate::error::{Error, Result};
use rayon::prelude::*;

use super::par::worth_parallel;

/// Confidences `[B·K]` from hidden states `[B, K, H]`, optional previous-token Markov embeddings
/// `[B·K·r]` (as in [`super::DraftBlock::prev_embeddings`]), a weight of `H` (+ `r`) values and a
/// bias.
pub fn confidence_slices(
    hidden: Rows3<'_>,
    prev_embeddings: Option<&[f32]>,
    weight: Floats<'_>,
    bias: f32,
    sts: Option<&StsCalibration>,
) -> Result<Vec<f32>> {
    hidden.check("hidden")?;
    let [b_n, k_n, h] = hidden.dims;
    let rows = b_n * k_n;
    let r = match prev_embeddings {
        None => {
            if weight.len() != h {
                return Err(Error::bad_shape(
                    "weight",
                    format!(
                        "{} values, expected H = {h} (no Markov embeddings given)",
                        weight.len()
                    ),
                ));
            }
            0
        }
        Some(e) => {
            let Some(r) = weight.len().checked_sub(h) else {
                return Err(Error::bad_shape(
                    "weight",
                    format!("{} values, fewer than H = {h}", weight.len()),
                ));
            };
            if e.len() != rows * r {
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
    if !bias.is_finite() {
        return Err(Error::NonFinite {
            name: "bias".into(),
            message: format!("{bias}"),
        });
    }
    let temps: Vec<f32> = match sts {
        Some(s) => (0..k_n).map(|k| s.temperature(k)).collect::<Result<_>>()?,
        None => vec![1.0; k_n],
    };
    let mut w = vec![0f32; h + r];
    weight.read_into(0, &mut w);
    let (wh, we) = w.split_at(h);
    let score = |buf: &mut Vec<f32>, i: usize| {
        hidden.data.read_into(i * h, buf);
        let mut z = dot(wh, buf);
        if let Some(e) = prev_embeddings {
            z += dot(we, &e[i * r..(i + 1) * r]);
        }
        let z = (z + bias) / temps[i % k_n];
        1.0 / (1.0 + (-z).exp())
    };
    Ok(if worth_parallel(rows * (h + r)) {
        (0..rows)
            .into_par_iter()
            .map_init(|| vec![0f32; h], score)
            .collect()
    } else {
        let mut buf = vec![0f32; h];
        (0..rows).map(|i| score(&mut buf, i)).collect()
    })
}
