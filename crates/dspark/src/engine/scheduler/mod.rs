//! The scheduler: which requests run. It holds the queue and the running rows, admits and
//! preempts under the [`Budget`], applies aborts and retires what finished. It knows requests
//! by their specs and their slots' lengths, never a model: the engine applies its row changes
//! to the target cache ([`Compaction`], the rows [`Scheduler::admit`] returns) and a round
//! runs over its rows.
//!
//! Files: `mod.rs` (the type, the request registry, finishing), `admit.rs` (preemption and
//! admission), `slot.rs` (a request's state).

mod admit;
mod slot;
#[cfg(test)]
mod tests;

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) use slot::{Slot, Waiting, feature_rows};

use super::config::Budget;
use super::metrics::EngineMetrics;
use super::output::{FinishReason, RequestOutput, RequestUsage, StepOutput};
use super::request::{RequestId, RequestSpec};
use crate::error::{Error, Result};

/// The requests an engine holds, and aborts asked for since the last step: shared with
/// [`AbortHandle`]s on other threads.
#[derive(Debug, Default)]
struct Live {
    ids: HashSet<RequestId>,
    aborts: Vec<RequestId>,
}

/// Aborts requests of an [`Engine`](super::Engine) from any thread; they take effect at the
/// next step.
#[derive(Debug, Clone)]
pub struct AbortHandle(Arc<Mutex<Live>>);

impl AbortHandle {
    /// Abort `id`: it ends with [`FinishReason::Aborted`] at the next step (its cache row is
    /// freed then). Errors: `invalid-argument` for an id the engine does not hold (unknown,
    /// or already finished).
    pub fn abort(&self, id: RequestId) -> Result<()> {
        let mut live = lock(&self.0)?;
        if !live.ids.contains(&id) {
            return Err(Error::invalid(
                "request_id",
                format!("{id} is not held by this engine (unknown, or already finished)"),
            ));
        }
        if !live.aborts.contains(&id) {
            live.aborts.push(id);
        }
        Ok(())
    }
}

fn lock(m: &Mutex<Live>) -> Result<MutexGuard<'_, Live>> {
    m.lock().map_err(|_| Error::Internal {
        message: "the engine's request registry lock is poisoned".into(),
    })
}

/// What the target cache must do after the scheduler dropped rows ([`Scheduler::compaction`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Compaction {
    /// Nothing to drop.
    Keep,
    /// No request holds a row: drop the cache.
    Clear,
    /// Keep the rows marked `true`, in order.
    Retain(Vec<bool>),
}

/// The queue and the running rows of one engine, over drafter states `S`.
#[derive(Debug)]
pub(crate) struct Scheduler<S> {
    budget: Budget,
    /// Requests join and leave a running batch (the target grows and retains cache rows).
    /// Otherwise a batch runs until all of its requests finish (static batches).
    continuous: bool,
    /// Drafts verified per round at most (the engine's limit).
    num_speculative: usize,
    /// Row `i` of the target cache: its request (`None`: a finished row of a static batch,
    /// or one a step freed).
    pub(crate) rows: Vec<Option<Slot<S>>>,
    waiting: VecDeque<Waiting>,
    next_id: u64,
    /// Admissions so far (each running request's admission order).
    admissions: u64,
    live: Arc<Mutex<Live>>,
}

impl<S> Scheduler<S> {
    /// An empty scheduler under `budget`.
    pub(crate) fn new(budget: Budget, continuous: bool, num_speculative: usize) -> Self {
        Self {
            budget,
            continuous,
            num_speculative,
            rows: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 0,
            admissions: 0,
            live: Arc::new(Mutex::new(Live::default())),
        }
    }

    /// The id the next request gets.
    pub(crate) fn next_id(&self) -> RequestId {
        RequestId(self.next_id)
    }

    /// Queue a request (checked by the engine); it joins at a step when the budget has room.
    pub(crate) fn add(&mut self, spec: RequestSpec) -> Result<RequestId> {
        let id = RequestId(self.next_id);
        lock(&self.live)?.ids.insert(id);
        self.next_id += 1;
        self.waiting.push_back(Waiting {
            id,
            usage: RequestUsage {
                prompt_tokens: spec.prompt.len(),
                ..Default::default()
            },
            spec,
            out: Vec::new(),
        });
        Ok(id)
    }

    /// Drafts a round verifies for `spec` at most: the engine's limit, lowered by its own.
    pub(crate) fn drafts_for(&self, spec: &RequestSpec) -> usize {
        spec.max_drafts
            .map_or(self.num_speculative, |m| m.min(self.num_speculative))
    }

    /// A handle that aborts requests from another thread.
    pub(crate) fn abort_handle(&self) -> AbortHandle {
        AbortHandle(Arc::clone(&self.live))
    }

    /// Whether a step has anything to do: running or waiting requests, or aborts to apply.
    pub(crate) fn has_work(&self) -> bool {
        self.num_running() > 0
            || !self.waiting.is_empty()
            || self.live.lock().is_ok_and(|l| !l.aborts.is_empty())
    }

    /// Requests in the running batch.
    pub(crate) fn num_running(&self) -> usize {
        self.rows.iter().flatten().count()
    }

    /// Requests waiting for room (new, or preempted).
    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV tokens the running requests' cache rows hold.
    pub(crate) fn kv_used(&self) -> usize {
        self.rows.iter().flatten().map(|s| s.len).sum()
    }

    /// Drop every request (after a failed step, for a caller that starts over).
    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        self.waiting.clear();
        if let Ok(mut live) = self.live.lock() {
            live.ids.clear();
            live.aborts.clear();
        }
    }

    /// Take the aborts queued since the last step: waiting requests leave the queue, running
    /// ones leave their rows (freed by the next compaction).
    pub(crate) fn apply_aborts(
        &mut self,
        out: &mut StepOutput,
        metrics: &mut EngineMetrics,
    ) -> Result<()> {
        let aborts = std::mem::take(&mut lock(&self.live)?.aborts);
        for id in aborts {
            if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
                if let Some(w) = self.waiting.remove(i) {
                    out.outputs
                        .push(ended(w.id, FinishReason::Aborted, w.usage, None));
                }
            } else if let Some(row) = self
                .rows
                .iter_mut()
                .find(|r| r.as_ref().is_some_and(|s| s.id == id))
                && let Some(slot) = row.take()
            {
                out.outputs
                    .push(ended(slot.id, FinishReason::Aborted, slot.usage, None));
            } else {
                continue;
            }
            metrics.requests_aborted += 1;
            lock(&self.live)?.ids.remove(&id);
        }
        Ok(())
    }

    /// Waiting requests with no tokens to generate end at once (`length`), never prefilled
    /// (a static batch finishes them at admission, keeping its row layout).
    pub(crate) fn finish_empty(
        &mut self,
        out: &mut StepOutput,
        metrics: &mut EngineMetrics,
    ) -> Result<()> {
        if !self.continuous {
            return Ok(());
        }
        let (empty, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.spec.max_new_tokens == 0);
        self.waiting = rest.into_iter().collect();
        for w in empty {
            self.finish_unused(w, out, metrics)?;
        }
        Ok(())
    }

    /// End a request that never ran (`length`: it had nothing to generate).
    fn finish_unused(
        &mut self,
        w: Waiting,
        out: &mut StepOutput,
        metrics: &mut EngineMetrics,
    ) -> Result<()> {
        metrics.requests_length += 1;
        lock(&self.live)?.ids.remove(&w.id);
        out.outputs
            .push(ended(w.id, FinishReason::Length, w.usage, None));
        Ok(())
    }

    /// Requests that finished in this round leave their rows; their outputs get the reason and
    /// final usage (their tokens were reported by the round).
    pub(crate) fn finish(
        &mut self,
        out: &mut StepOutput,
        metrics: &mut EngineMetrics,
    ) -> Result<()> {
        for row in &mut self.rows {
            let Some(reason) = row.as_ref().and_then(|s| s.finish) else {
                continue;
            };
            let Some(slot) = row.take() else { continue };
            match reason {
                FinishReason::Stop => metrics.requests_stopped += 1,
                FinishReason::Length => metrics.requests_length += 1,
                FinishReason::Aborted => metrics.requests_aborted += 1,
                FinishReason::Error => metrics.requests_failed += 1,
            }
            lock(&self.live)?.ids.remove(&slot.id);
            match out.outputs.iter_mut().find(|o| o.id == slot.id) {
                Some(o) => {
                    o.finish = Some(reason);
                    o.usage = slot.usage;
                    o.error = slot.error;
                }
                None => out
                    .outputs
                    .push(ended(slot.id, reason, slot.usage, slot.error)),
            }
        }
        Ok(())
    }

    /// Which rows the cache drops now: in a continuous engine every free row (the target
    /// retains the others), in a static batch all of them once every row is free. Apply it
    /// to the cache first, then to the rows ([`Scheduler::compact`]).
    pub(crate) fn compaction(&self) -> Compaction {
        if self.rows.iter().all(Option::is_none) {
            return Compaction::Clear;
        }
        if !self.continuous || self.rows.iter().all(Option::is_some) {
            return Compaction::Keep;
        }
        Compaction::Retain(self.rows.iter().map(Option::is_some).collect())
    }

    /// Drop the free rows `c` names (after the cache dropped them).
    pub(crate) fn compact(&mut self, c: &Compaction) {
        match c {
            Compaction::Keep => {}
            Compaction::Clear => self.rows.clear(),
            Compaction::Retain(_) => self.rows.retain(Option::is_some),
        }
    }
}

/// The output of a request that ends with no new tokens.
fn ended(
    id: RequestId,
    finish: FinishReason,
    usage: RequestUsage,
    error: Option<super::output::RequestError>,
) -> RequestOutput {
    RequestOutput {
        id,
        new_tokens: Vec::new(),
        logprobs: Vec::new(),
        drafted: 0,
        accepted: 0,
        finish: Some(finish),
        usage,
        error,
    }
}
