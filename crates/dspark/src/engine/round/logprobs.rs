//! Log-probabilities of a round's committed tokens, read off the logits the round already has
//! (the verification forward's rows, or a joining request's last prefill row): no extra
//! forward, and only the rows of requests that asked for them leave a device.

use candle_core::Tensor;

use crate::engine::request::SamplingParams;
use crate::error::Result;
use crate::sampling::{LogprobSampling, Mat, TokenLogprob, token_logprobs};
use crate::view::with_floats;

/// The log-probabilities of `tokens`, drawn at positions `from..` of row `i` of `logits`
/// (`[B, W, V]`), under `sampling`, each with `top` alternatives.
pub(super) fn row_logprobs(
    logits: &Tensor,
    i: usize,
    from: usize,
    tokens: &[u32],
    sampling: SamplingParams,
    top: usize,
) -> Result<Vec<TokenLogprob>> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let rows = logits.get(i)?.narrow(0, from, tokens.len())?;
    let vocab = rows.dim(1)?;
    let how = LogprobSampling {
        temperature: sampling.temperature,
        top_k: sampling.top_k,
        top_p: sampling.top_p,
    };
    with_floats(&rows, "target logits", |data| {
        let m = Mat::new(data, [tokens.len(), vocab])?;
        tokens
            .iter()
            .enumerate()
            .map(|(k, &t)| token_logprobs(m.row(k), how, t, top))
            .collect()
    })
}
