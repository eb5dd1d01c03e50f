//! What a generation hands back: the streaming update and the result.

use super::stats::Stats;
use crate::error::Result;

/// The tokens each request committed since the previous callback (one slice per request of
/// the call, possibly empty), handed to the streaming callback after the prefill and after
/// every round.
#[derive(Debug)]
pub struct RoundUpdate<'a> {
    /// Rounds run so far (`0` right after the prefill).
    pub round: usize,
    /// Per request: the newly committed tokens.
    pub new_tokens: Vec<&'a [u32]>,
    /// Per request: finished (budget reached or stop token emitted).
    pub finished: &'a [bool],
}

/// The streaming callback: return an error to abort the generation (it is returned as is).
pub type OnRound<'c> = &'c mut dyn FnMut(&RoundUpdate<'_>) -> Result<()>;

/// Generated tokens (prompt excluded), one list per request, and the call's statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Per request, the generated ids (a stop token that ended a request is included).
    pub tokens: Vec<Vec<u32>>,
    /// What the call did.
    pub stats: Stats,
}
