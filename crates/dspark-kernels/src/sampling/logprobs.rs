//! Log-probabilities of emitted tokens under the distribution they were drawn from.
//!
//! A sampled token's distribution is the verification's: `softmax(logits / T)`, then top-k,
//! then top-p, renormalized (the verification's `Dist`); tokens outside the kept set have
//! probability 0 and are never listed. A greedy token (temperature below [`GREEDY_BELOW`](super::GREEDY_BELOW)) is
//! the argmax of a point mass; its log-probabilities are the model's own, `log_softmax` of
//! the raw logits with no truncation, which is what an evaluation harness asks for.
//!
//! One statistics pass over the row, plus a top-`n` selection pass when alternatives are asked
//! for (and the truncation passes when top-k / top-p are on): no sort of the vocabulary.

use super::dist::Dist;
use super::filter::top_k_members;
use super::is_greedy_temperature;
use crate::error::{Error, Result};
use crate::view::Floats;

/// Most alternatives listed per token (OpenAI's `top_logprobs` bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One emitted token's log-probability and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The emitted token.
    pub token: u32,
    /// Its natural log-probability (finite: an emitted token is always in the kept set).
    pub logprob: f32,
    /// Up to the asked number of `(token, logprob)`, most likely first (ties: lower id first),
    /// tokens of probability 0 left out.
    pub top: Vec<(u32, f32)>,
}

/// How a row's tokens were drawn: the request's sampling values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogprobSampling {
    /// Temperature (below [`GREEDY_BELOW`](super::GREEDY_BELOW): greedy).
    pub temperature: f32,
    /// Top-k (`None`: off).
    pub top_k: Option<usize>,
    /// Top-p in `(0, 1]` (`1`: off).
    pub top_p: f32,
}

/// The log-probability of `token` in `row` (one position's logits) under `sampling`, with the
/// `top` most likely tokens (at most [`MAX_TOP_LOGPROBS`]). Errors: a row with NaN or `+inf`
/// (`non-finite`), no finite entry, a token outside the row, or `top` over the bound
/// (`invalid-argument`).
pub fn token_logprobs(
    row: Floats<'_>,
    sampling: LogprobSampling,
    token: u32,
    top: usize,
) -> Result<TokenLogprob> {
    let v = token as usize;
    if v >= row.len() {
        return Err(Error::invalid(
            "token",
            format!("{token} is outside a row of {} logits", row.len()),
        ));
    }
    if top > MAX_TOP_LOGPROBS {
        return Err(Error::invalid(
            "top_logprobs",
            format!("{top}: at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    let greedy = is_greedy_temperature(sampling.temperature);
    let (s, top_k, top_p) = if greedy {
        (1.0, None, 1.0)
    } else {
        (1.0 / sampling.temperature, sampling.top_k, sampling.top_p)
    };
    let mut blocks = Vec::new();
    let dist = Dist::new(row, s, top_k, top_p, &mut blocks, "logits", || {
        "the row".to_string()
    })?;
    let ln_z = dist.z.ln();
    let logprob = |x: f32, id: usize| -> Option<f32> {
        (dist.weight(x, id) > 0.0).then(|| (f64::from((x - dist.stats.max) * s) - ln_z) as f32)
    };
    let chosen = logprob(row.get(v), v).unwrap_or(f32::NEG_INFINITY);
    let top = if top == 0 {
        Vec::new()
    } else {
        top_k_members(row, top)
            .into_iter()
            .filter_map(|(x, id)| logprob(x, id).map(|lp| (id as u32, lp)))
            .collect()
    };
    Ok(TokenLogprob {
        token,
        logprob: chosen,
        top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(row: &[f32], t: f32) -> Vec<f64> {
        let s = 1.0 / f64::from(t);
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = row.iter().map(|&x| ((f64::from(x - m)) * s).exp()).sum();
        row.iter().map(|&x| f64::from(x - m) * s - z.ln()).collect()
    }

    fn sampled(temperature: f32, top_k: Option<usize>, top_p: f32) -> LogprobSampling {
        LogprobSampling {
            temperature,
            top_k,
            top_p,
        }
    }

    #[test]
    fn greedy_reports_the_models_log_softmax() {
        let row = [1.0f32, 3.0, -2.0, 3.0, 0.5];
        let want = reference(&row, 1.0);
        let got = token_logprobs(Floats::F32(&row), sampled(0.0, Some(1), 0.1), 4, 3).unwrap();
        assert!((f64::from(got.logprob) - want[4]).abs() < 1e-6);
        // Ties by lower id; the greedy truncation settings do not apply.
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 0]);
        for (id, lp) in got.top {
            assert!((f64::from(lp) - want[id as usize]).abs() < 1e-6);
        }
    }

    #[test]
    fn temperature_scales_and_truncation_renormalizes() {
        let row = [2.0f32, 1.0, 0.0, -1.0, f32::NEG_INFINITY];
        let want = reference(&row[..4], 0.5);
        let got = token_logprobs(Floats::F32(&row), sampled(0.5, None, 1.0), 2, 5).unwrap();
        assert!((f64::from(got.logprob) - want[2]).abs() < 1e-6);
        // The masked token (-inf) is never listed.
        assert_eq!(got.top.len(), 4);
        // Top-2: the kept pair renormalized; a token outside it has -inf and is not listed.
        let got = token_logprobs(Floats::F32(&row), sampled(1.0, Some(2), 1.0), 1, 5).unwrap();
        let pair = reference(&row[..2], 1.0);
        assert!((f64::from(got.logprob) - pair[1]).abs() < 1e-6);
        assert_eq!(got.top.len(), 2);
        let out = token_logprobs(Floats::F32(&row), sampled(1.0, Some(2), 1.0), 3, 0).unwrap();
        assert_eq!(out.logprob, f32::NEG_INFINITY);
        // Top-p 0.5 keeps the first token alone (its mass is 0.64 of the total).
        let got = token_logprobs(Floats::F32(&row), sampled(1.0, None, 0.5), 0, 3).unwrap();
        assert_eq!(got.logprob, 0.0);
        assert_eq!(got.top, vec![(0, 0.0)]);
    }

    #[test]
    fn probabilities_of_the_listed_tokens_sum_to_one_over_the_row() {
        let row: Vec<f32> = (0..40).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let got = token_logprobs(Floats::F32(&row), sampled(0.7, Some(20), 1.0), 0, 20).unwrap();
        let mass: f64 = got.top.iter().map(|t| f64::from(t.1).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-5, "{mass}");
    }

    #[test]
    fn bad_input_is_typed() {
        let row = [0.0f32, 1.0];
        let bad = |r: Result<TokenLogprob>| r.unwrap_err().code();
        assert_eq!(
            bad(token_logprobs(
                Floats::F32(&row),
                sampled(1.0, None, 1.0),
                2,
                0
            )),
            "invalid-argument"
        );
        assert_eq!(
            bad(token_logprobs(
                Floats::F32(&row),
                sampled(1.0, None, 1.0),
                0,
                21
            )),
            "invalid-argument"
        );
        let nan = [0.0f32, f32::NAN];
        assert_eq!(
            bad(token_logprobs(
                Floats::F32(&nan),
                sampled(1.0, None, 1.0),
                0,
                0
            )),
            "non-finite"
        );
    }
}
