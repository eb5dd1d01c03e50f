//! A verification call's options and outcome, and the validation every kernel path shares:
//! [`prepare`] turns the shapes, draft ids and [`VerifyOptions`] of a call into a [`Plan`] (its
//! geometry, one checked [`Request`] per request, the sorted stop ids). The kernels (the host
//! slice kernel, the tensor path, the fused launches) take the plan; none of them is imported
//! here.

use super::super::rng::Stream;
use crate::error::{Error, Result};
use crate::limits::output_elements;
use crate::view::{PerRequest, Rows3, Seeds, Tokens};

/// Options of a verification (`verify_slices`, `verify`).
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyOptions {
    /// Target temperature per request; `0` = greedy. Must be finite and `>= 0`.
    pub temperature: PerRequest<f32>,
    /// Target top-k per request (`None` = off; `Some(0)` is an error).
    pub top_k: PerRequest<Option<usize>>,
    /// Target top-p per request in `(0, 1]`; `1.0` = off.
    pub top_p: PerRequest<f32>,
    /// Random seeds (see [`Seeds`]).
    pub seeds: Seeds,
    /// Verify only the first `num_draft[r]` drafts of request `r` (each `<= K`); `None` = all `K`.
    pub num_draft: Option<Vec<usize>>,
    /// Target ids that end the round when accepted.
    pub stop_token_ids: Vec<u32>,
}

impl Default for VerifyOptions {
    /// Temperature 1, no truncation, seed 0, every draft verified, no stop tokens.
    fn default() -> Self {
        VerifyOptions {
            temperature: PerRequest::All(1.0),
            top_k: PerRequest::All(None),
            top_p: PerRequest::All(1.0),
            seeds: Seeds::Scalar(0),
            num_draft: None,
            stop_token_ids: Vec::new(),
        }
    }
}

/// The outcome of verifying a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Number of requests `B`.
    pub batch: usize,
    /// Row width `K + 1`.
    pub width: usize,
    /// `[B, K+1]` emitted target ids: the accepted drafts, then the correction or bonus token
    /// (absent after an accepted stop token), then `-1`.
    pub tokens: Vec<i64>,
    /// `[B]` number of accepted drafts.
    pub num_accepted: Vec<u32>,
}

impl Verification {
    /// The emitted tokens of request `r` (without the `-1` padding).
    pub fn emitted(&self, r: usize) -> &[i64] {
        let row = &self.tokens[r * self.width..(r + 1) * self.width];
        let n = row.iter().position(|&t| t < 0).unwrap_or(self.width);
        &row[..n]
    }
}

/// Per-request settings after validation.
pub(crate) struct Request {
    /// Temperature (finite, `>= 0`).
    pub temperature: f32,
    /// Top-k (`None` = off).
    pub top_k: Option<usize>,
    /// Top-p in `(0, 1]`.
    pub top_p: f32,
    /// The request's random stream.
    pub stream: Stream,
    /// Drafts to verify.
    pub num_draft: usize,
}

impl Request {
    /// `T` below [`super::super::GREEDY_BELOW`] (zero included): the distribution is the argmax.
    pub(crate) fn greedy(&self) -> bool {
        super::super::is_greedy_temperature(self.temperature)
    }
}

/// A call's host rows: `target` `[B, K+1, V]`, the `B·K` draft ids, the optional draft logits
/// `[B, K, V]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostRows<'a> {
    pub target: Rows3<'a>,
    pub tokens: &'a [i64],
    pub draft: Option<Rows3<'a>>,
}

impl<'a> HostRows<'a> {
    /// A call's rows.
    pub(crate) fn new(target: Rows3<'a>, tokens: &'a [i64], draft: Option<Rows3<'a>>) -> Self {
        HostRows {
            target,
            tokens,
            draft,
        }
    }
}

/// A validated verification call: its geometry, per-request settings and sorted stop ids.
pub(crate) struct Plan {
    /// `[B, K+1, V]`.
    pub dims: [usize; 3],
    /// One per request.
    pub requests: Vec<Request>,
    /// Sorted stop token ids.
    pub stops: Vec<u32>,
}

/// Validate a call from its shapes (`draft_logits`: the dims of the optional draft logits),
/// the draft tokens and the options: the checks of every kernel path.
pub(crate) fn prepare(
    dims: [usize; 3],
    draft_tokens: Tokens<'_>,
    draft_logits: Option<[usize; 3]>,
    opts: &VerifyOptions,
) -> Result<Plan> {
    check_call(
        dims,
        draft_tokens.dims,
        Some(draft_tokens.data),
        draft_logits,
        opts,
    )
}

/// [`prepare`] without the draft ids' range checks (the fused kernels check ids where they
/// are): shapes and settings.
pub(crate) fn prepare_params(
    dims: [usize; 3],
    tokens_dims: [usize; 2],
    draft_logits: Option<[usize; 3]>,
    opts: &VerifyOptions,
) -> Result<Plan> {
    check_call(dims, tokens_dims, None, draft_logits, opts)
}

fn check_call(
    dims: [usize; 3],
    tokens_dims: [usize; 2],
    tokens: Option<&[i64]>,
    draft_logits: Option<[usize; 3]>,
    opts: &VerifyOptions,
) -> Result<Plan> {
    let [batch, width, vocab] = dims;
    if width == 0 || vocab == 0 {
        return Err(Error::bad_shape(
            "target_logits",
            format!("dims {dims:?}: need K+1 >= 1 rows and a non-empty vocabulary"),
        ));
    }
    let k = width - 1;
    if tokens_dims != [batch, k] {
        let transposed = if tokens_dims == [k, batch] && k != batch {
            " (transposed? draft tokens are [B, K])"
        } else {
            ""
        };
        return Err(Error::bad_shape(
            "draft_tokens",
            format!(
                "dims {:?}, expected [B, K] = {:?} from target_logits{transposed}",
                tokens_dims,
                [batch, k]
            ),
        ));
    }
    // `[B, K+1]` outputs (bounded by the target's own size since `V >= 1`; checked anyway).
    output_elements("target_logits", &[batch as u64, width as u64])?;
    if let Some(d) = draft_logits.filter(|&d| d != [batch, k, vocab]) {
        return Err(Error::bad_shape(
            "draft_logits",
            format!("dims {d:?}, expected [B, K, V] = {:?}", [batch, k, vocab]),
        ));
    }
    let requests = resolve(batch, k, vocab, tokens, opts)?;
    let mut stops = opts.stop_token_ids.clone();
    stops.sort_unstable();
    Ok(Plan {
        dims,
        requests,
        stops,
    })
}

fn resolve(
    batch: usize,
    k: usize,
    vocab: usize,
    draft_tokens: Option<&[i64]>,
    opts: &VerifyOptions,
) -> Result<Vec<Request>> {
    let temps = opts.temperature.resolve(batch, "temperature")?;
    let top_ks = opts.top_k.resolve(batch, "top_k")?;
    let top_ps = opts.top_p.resolve(batch, "top_p")?;
    let streams = opts.seeds.streams(batch, "seeds")?;
    let nd = match &opts.num_draft {
        None => vec![k; batch],
        Some(v) if v.len() != batch => {
            return Err(Error::bad_shape(
                "num_draft",
                format!("{} values for a batch of {batch}", v.len()),
            ));
        }
        Some(v) => v.clone(),
    };
    let mut out = Vec::with_capacity(batch);
    for r in 0..batch {
        let (t, tk, tp, n) = (temps[r], top_ks[r], top_ps[r], nd[r]);
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::invalid(
                "temperature",
                format!("request {r}: {t} (must be finite and >= 0)"),
            ));
        }
        if tk == Some(0) {
            return Err(Error::invalid(
                "top_k",
                format!("request {r}: 0 (use None for off)"),
            ));
        }
        if !(tp > 0.0 && tp <= 1.0) {
            return Err(Error::invalid(
                "top_p",
                format!("request {r}: {tp} (must be in (0, 1])"),
            ));
        }
        if n > k {
            return Err(Error::invalid(
                "num_draft",
                format!("request {r}: {n} drafts but only K = {k} slots"),
            ));
        }
        for &x in draft_tokens.map_or(&[][..], |t| &t[r * k..r * k + n]) {
            if x < 0 || x as u64 >= vocab as u64 {
                return Err(Error::TokenOutOfRange {
                    name: "draft_tokens".into(),
                    id: x,
                    vocab_size: vocab,
                });
            }
        }
        out.push(Request {
            temperature: t,
            top_k: tk,
            top_p: tp,
            stream: streams[r],
            num_draft: n,
        });
    }
    Ok(out)
}
