//! [`Engine::step`]: aborts, preemption and admission, one round, then what finished.

use std::time::Instant;

use super::engine::{Engine, lock};
use super::output::{FinishReason, RequestOutput, StepOutput};
use super::slot::Waiting;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::target::TargetModel;

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// One step: apply the aborts asked for since the last step, make room (preempting the
    /// newest running requests when the KV budget cannot hold every running request's next
    /// round), admit waiting requests the budget has room for, then run one round over every
    /// running request — a joining request's prefill in the same forward where the target is
    /// ragged — and drop what finished.
    ///
    /// The output has an entry per request that committed tokens, finished or was aborted.
    /// A failed step (the target or drafter failed) leaves the engine holding its requests;
    /// abort them or drop the engine.
    pub fn step(&mut self) -> Result<StepOutput> {
        let t0 = Instant::now();
        let mut out = StepOutput::default();
        self.apply_aborts(&mut out)?;
        self.finish_empty(&mut out)?;
        self.compact()?;
        self.preempt()?;
        self.admit(&mut out)?;
        if self.rows.iter().flatten().next().is_some() {
            // Decode-sized work runs inline on this thread (see `crate::threads`).
            crate::threads::in_round(|| self.round(&mut out))?;
        }
        self.finish(&mut out)?;
        self.compact()?;
        self.metrics.steps += 1;
        let spent = t0.elapsed().as_secs_f64();
        let t = &mut out.timing;
        // Whatever the round did not attribute (aborts, admission, planning, cache edits) is
        // the engine's own overhead.
        t.overhead_seconds =
            (spent - t.drafter_seconds - t.target_seconds - t.kernel_seconds).max(0.0);
        Ok(out)
    }

    /// Take the aborts queued since the last step: waiting requests leave the queue, running
    /// ones leave their rows (freed by the next compaction).
    fn apply_aborts(&mut self, out: &mut StepOutput) -> Result<()> {
        let aborts = std::mem::take(&mut lock(&self.live)?.aborts);
        for id in aborts {
            if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
                if let Some(w) = self.waiting.remove(i) {
                    out.outputs.push(aborted(w.id, w.usage));
                }
            } else if let Some(row) = self
                .rows
                .iter_mut()
                .find(|r| r.as_ref().is_some_and(|s| s.id == id))
                && let Some(slot) = row.take()
            {
                out.outputs.push(aborted(slot.id, slot.usage));
            } else {
                continue;
            }
            self.metrics.requests_aborted += 1;
            lock(&self.live)?.ids.remove(&id);
        }
        Ok(())
    }

    /// Waiting requests with no tokens to generate end at once (`length`), never prefilled
    /// (a static batch finishes them at admission, keeping its row layout).
    fn finish_empty(&mut self, out: &mut StepOutput) -> Result<()> {
        if !self.continuous {
            return Ok(());
        }
        let (empty, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.spec.max_new_tokens == 0);
        self.waiting = rest.into_iter().collect();
        for w in empty {
            self.finish_unused(w, out)?;
        }
        Ok(())
    }

    /// End a request that never ran (`length`: it had nothing to generate).
    pub(super) fn finish_unused(&mut self, w: Waiting, out: &mut StepOutput) -> Result<()> {
        self.metrics.requests_length += 1;
        lock(&self.live)?.ids.remove(&w.id);
        out.outputs.push(RequestOutput {
            id: w.id,
            new_tokens: Vec::new(),
            drafted: 0,
            accepted: 0,
            finish: Some(FinishReason::Length),
            usage: w.usage,
            error: None,
        });
        Ok(())
    }

    /// Requests that finished in this round leave their rows; their outputs get the reason and
    /// final usage (their tokens were reported by the round).
    fn finish(&mut self, out: &mut StepOutput) -> Result<()> {
        for row in &mut self.rows {
            let Some(reason) = row.as_ref().and_then(|s| s.finish) else {
                continue;
            };
            let Some(slot) = row.take() else { continue };
            match reason {
                FinishReason::Stop => self.metrics.requests_stopped += 1,
                FinishReason::Length => self.metrics.requests_length += 1,
                FinishReason::Aborted => self.metrics.requests_aborted += 1,
                FinishReason::Error => self.metrics.requests_failed += 1,
            }
            lock(&self.live)?.ids.remove(&slot.id);
            match out.outputs.iter_mut().find(|o| o.id == slot.id) {
                Some(o) => {
                    o.finish = Some(reason);
                    o.usage = slot.usage;
                    o.error = slot.error;
                }
                None => out.outputs.push(RequestOutput {
                    id: slot.id,
                    new_tokens: Vec::new(),
                    drafted: 0,
                    accepted: 0,
                    finish: Some(reason),
                    usage: slot.usage,
                    error: slot.error,
                }),
            }
        }
        Ok(())
    }

    /// Drop the rows no request holds: in a continuous engine at once (the target retains the
    /// others), in a static batch once every row is free.
    pub(super) fn compact(&mut self) -> Result<()> {
        if self.rows.iter().all(Option::is_none) {
            self.rows.clear();
            self.cache = None;
            return Ok(());
        }
        if !self.continuous || self.rows.iter().all(Option::is_some) {
            return Ok(());
        }
        let keep: Vec<bool> = self.rows.iter().map(Option::is_some).collect();
        if let Some(cache) = self.cache.as_mut() {
            self.target.retain(cache, &keep)?;
        }
        self.rows.retain(Option::is_some);
        Ok(())
    }
}

fn aborted(id: super::request::RequestId, usage: super::output::RequestUsage) -> RequestOutput {
    RequestOutput {
        id,
        new_tokens: Vec::new(),
        drafted: 0,
        accepted: 0,
        finish: Some(FinishReason::Aborted),
        usage,
        error: None,
    }
}
