//! The host confidence scoring loop: one dot product per row over the hidden state and the
//! previous-token embedding, on the pool when the call is large enough.

use rayon::prelude::*;

use super::{Scoring, non_finite_row, temperatures};
use crate::cpu::dot;
use crate::cpu::par::worth_parallel;
use crate::error::Result;

/// The host scoring loop over a validated call.
pub(super) fn score(call: &Scoring<'_>) -> Result<Vec<f32>> {
    let Scoring {
        hidden,
        prev: prev_embeddings,
        w,
        bias,
        sts,
        r,
    } = *call;
    let [b_n, k_n, h] = hidden.dims;
    let rows = b_n * k_n;
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
