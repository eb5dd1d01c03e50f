//! One request on the HTTP side: its engine events turned into text deltas (detokenized,
//! stop strings applied), its usage and dspark figures, and its latency metrics.
//!
//! Dropping a session before its request finished aborts the request in the engine (the
//! [`AbortGuard`] it holds): that is how a client disconnect reaches the engine.

use std::sync::Arc;
use std::time::Instant;

use dspark::engine::{FinishReason, RequestSpec, RequestUsage};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::ApiError;
use crate::api::response::{SpecStats, Usage};
use crate::detok::Detokenizer;
use crate::engine_thread::{AbortGuard, Event, Reservation, Submitted};
use crate::logprobs::{LogprobEntry, Pieces};
use crate::metrics::{AbortCause, Outcome, ServerMetrics};
use crate::state::AppState;

/// How a request ended, as the client is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finish {
    /// `stop`, `length` or `abort`.
    pub reason: &'static str,
    /// Token counts.
    pub usage: Usage,
    /// dspark's figures.
    pub stats: SpecStats,
}

/// A piece of the answer: final text and, when the request asked for them, the entries of
/// the tokens taken into the answer since the last piece (their text may still be held back,
/// waiting on a stop string or a split character).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Out {
    /// New final text.
    pub text: String,
    /// `None` without `logprobs`.
    pub logprobs: Option<Vec<LogprobEntry>>,
}

impl Out {
    /// Append `more` (a later piece).
    pub fn append(&mut self, more: Out) {
        self.text.push_str(&more.text);
        if let Some(new) = more.logprobs {
            self.logprobs.get_or_insert_with(Vec::new).extend(new);
        }
    }
}

/// What a session yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// New final text (and log-probabilities).
    Text(Out),
    /// The last piece and how the request ended.
    Done(Out, Finish),
}

/// A request in flight; see the module docs.
pub struct Session {
    events: UnboundedReceiver<Event>,
    guard: AbortGuard,
    detok: Detokenizer,
    /// With `logprobs`: the tokenizer's pieces and the entries not yet handed out.
    logprobs: Option<(Arc<Pieces>, Vec<LogprobEntry>)>,
    metrics: Arc<ServerMetrics>,
    arrived: Instant,
    prompt_tokens: usize,
    /// Tokens taken into the text (up to the one that completed a stop string).
    tokens: usize,
    usage: RequestUsage,
    first: Option<Instant>,
    last: Option<Instant>,
    done: bool,
}

impl Session {
    /// Submit `spec` on the reserved `slot` and wait until the engine admits it (its errors are
    /// the request's).
    pub async fn start(
        state: &AppState,
        slot: Reservation,
        spec: RequestSpec,
        stops: Vec<String>,
        arrived: Instant,
    ) -> Result<Self, ApiError> {
        let prompt_tokens = spec.prompt.len();
        let logprobs = spec
            .logprobs
            .map(|_| (Arc::clone(&state.model.pieces), Vec::new()));
        let detok = Detokenizer::new(Arc::clone(&state.model.tokenizer), &spec.prompt, stops);
        let Submitted {
            mut events,
            mut guard,
        } = state.engine.submit(slot, spec)?;
        match events.recv().await {
            Some(Event::Admitted) => {}
            Some(Event::Rejected(e)) => {
                guard.disarm();
                return Err(e);
            }
            _ => {
                guard.disarm();
                return Err(ApiError::unavailable(
                    "engine_stopped",
                    "the engine has stopped",
                ));
            }
        }
        Ok(Self {
            events,
            guard,
            detok,
            logprobs,
            metrics: Arc::clone(&state.metrics),
            arrived,
            prompt_tokens,
            tokens: 0,
            usage: RequestUsage::default(),
            first: None,
            last: None,
            done: false,
        })
    }

    fn finish(&mut self, reason: FinishReason, at: Instant) -> Finish {
        self.done = true;
        self.guard.disarm();
        let outcome = match reason {
            FinishReason::Stop => Outcome::Stop,
            FinishReason::Length => Outcome::Length,
            // A failed request gets `Event::Failed`, never `Finished`.
            FinishReason::Aborted | FinishReason::Error => Outcome::Abort,
        };
        let ttft = self
            .first
            .map(|t| t.saturating_duration_since(self.arrived));
        let tpot = match (self.first, self.last) {
            (Some(f), Some(l)) if self.tokens > 1 => {
                Some(l.saturating_duration_since(f) / (self.tokens as u32 - 1).max(1))
            }
            _ => None,
        };
        self.metrics.finished(
            outcome,
            ttft,
            tpot,
            at.saturating_duration_since(self.arrived),
        );
        let u = self.usage;
        Finish {
            reason: match reason {
                FinishReason::Aborted => "abort",
                r => r.as_str(),
            },
            usage: Usage::new(self.prompt_tokens, self.tokens),
            stats: SpecStats {
                acceptance_length: u.acceptance_length(),
                drafted_tokens: u.drafted_tokens,
                accepted_tokens: u.accepted_tokens,
                rounds: u.rounds,
                preemptions: u.preemptions,
            },
        }
    }

    fn detok_error(&mut self, e: impl std::fmt::Display) -> ApiError {
        self.done = true;
        self.guard.abort(AbortCause::Error);
        ApiError::internal(format!("detokenizing failed: {e}"))
    }

    /// `text` with the log-probability entries gathered since the last piece.
    fn out(&mut self, text: String) -> Out {
        Out {
            text,
            logprobs: self
                .logprobs
                .as_mut()
                .map(|(_, pending)| std::mem::take(pending)),
        }
    }

    /// The next piece of the answer; `Ok(None)` after [`Delta::Done`].
    pub async fn next(&mut self) -> Result<Option<Delta>, ApiError> {
        while !self.done {
            let Some(event) = self.events.recv().await else {
                self.done = true;
                self.guard.disarm();
                return Err(ApiError::unavailable(
                    "engine_stopped",
                    "the engine has stopped",
                ));
            };
            match event {
                Event::Tokens {
                    ids,
                    logprobs,
                    usage,
                    at,
                } => {
                    self.usage = usage;
                    self.first.get_or_insert(at);
                    self.last = Some(at);
                    for (n, id) in ids.into_iter().enumerate() {
                        self.tokens += 1;
                        if let (Some((pieces, pending)), Some(lp)) =
                            (self.logprobs.as_mut(), logprobs.get(n))
                        {
                            pending.push(pieces.entry(self.detok.tokenizer(), lp));
                        }
                        match self.detok.push(id) {
                            Ok(false) => {}
                            Ok(true) => {
                                self.guard.release();
                                let text = self.detok.ready();
                                let out = self.out(text);
                                return Ok(Some(Delta::Done(
                                    out,
                                    self.finish(FinishReason::Stop, at),
                                )));
                            }
                            Err(e) => return Err(self.detok_error(e)),
                        }
                    }
                    let text = self.detok.ready();
                    if !text.is_empty() {
                        return Ok(Some(Delta::Text(self.out(text))));
                    }
                }
                Event::Finished { reason, usage, at } => {
                    if reason != FinishReason::Aborted {
                        self.usage = usage;
                        self.tokens = usage.generated_tokens;
                    }
                    let (text, hit) = match self.detok.finish() {
                        Ok(v) => v,
                        Err(e) => return Err(self.detok_error(e)),
                    };
                    let reason = if hit { FinishReason::Stop } else { reason };
                    let out = self.out(text);
                    return Ok(Some(Delta::Done(out, self.finish(reason, at))));
                }
                Event::Failed(e) => {
                    self.done = true;
                    self.guard.disarm();
                    return Err(e);
                }
                Event::Admitted | Event::Rejected(_) => {}
            }
        }
        Ok(None)
    }

    /// The whole answer: all text (and log-probabilities) and how it ended.
    pub async fn collect(&mut self) -> Result<(Out, Finish), ApiError> {
        let mut all = Out::default();
        loop {
            match self.next().await? {
                Some(Delta::Text(t)) => all.append(t),
                Some(Delta::Done(t, finish)) => {
                    all.append(t);
                    return Ok((all, finish));
                }
                None => {
                    return Err(ApiError::internal("the request ended without a finish"));
                }
            }
        }
    }
}
