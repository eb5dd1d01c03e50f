//! Making room and letting requests in: the KV budget preempts the newest running requests
//! when the running batch cannot take its next round, and admits waiting requests, oldest
//! first, while the running count, the step's new tokens and the KV budget allow.

use super::{Scheduler, Slot, Waiting};
use crate::engine::metrics::EngineMetrics;
use crate::engine::output::StepOutput;
use crate::error::Result;

impl<S> Scheduler<S> {
    /// KV tokens running request `slot` may hold by the end of its next round: its cache
    /// row plus one verified block.
    fn kv_need(&self, slot: &Slot<S>) -> usize {
        slot.len + self.drafts_for(&slot.spec) + 1
    }

    /// Preempt the newest running requests until every other one's next round fits the KV
    /// budget (continuous engines with a KV budget only). A preempted request drops its
    /// cache row and drafter context and waits at the front of the queue, keeping what it
    /// committed; it resumes by re-prefilling it. Returns whether a request was preempted
    /// (its row is freed by the next compaction).
    pub(crate) fn preempt(&mut self, metrics: &mut EngineMetrics) -> bool {
        let Some(cap) = self.budget.kv_tokens.filter(|_| self.continuous) else {
            return false;
        };
        let mut need: usize = self.rows.iter().flatten().map(|s| self.kv_need(s)).sum();
        let mut preempted = false;
        while need > cap && self.num_running() > 1 {
            let newest = self
                .rows
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.as_ref().map(|s| (s.admitted, i)))
                .max();
            let Some((_, i)) = newest else { break };
            let Some(slot) = self.rows[i].take() else {
                break;
            };
            need -= self.kv_need(&slot);
            metrics.preemptions += 1;
            self.waiting.push_front(slot.into_waiting());
            preempted = true;
        }
        preempted
    }

    /// Admit waiting requests, oldest first, while they fit: at most `max_running` running,
    /// the step's new tokens (every running request's block, the joining prefills) within
    /// `max_batched_tokens` (a first joining prefill always fits: it was checked alone), and
    /// the KV budget. A static batch admits only when the engine is empty.
    ///
    /// Returns the joining rows (`None`: a static batch's request with nothing to generate,
    /// finished at once, keeping its row): the engine grows the cache by as many rows, then
    /// appends them ([`Scheduler::join`]).
    pub(crate) fn admit(
        &mut self,
        out: &mut StepOutput,
        metrics: &mut EngineMetrics,
    ) -> Result<Vec<Option<Slot<S>>>> {
        let mut joining = Vec::new();
        if self.waiting.is_empty() || (!self.continuous && !self.rows.is_empty()) {
            return Ok(joining);
        }
        let budget = self.budget;
        let running: Vec<&Slot<S>> = self.rows.iter().flatten().collect();
        let mut count = running.len();
        let mut tokens: usize = running.iter().map(|s| self.drafts_for(&s.spec) + 1).sum();
        let mut kv: usize = running.iter().map(|s| self.kv_need(s)).sum();
        let mut joined = 0;
        while let Some(w) = self.waiting.front() {
            let prefill = w.prefill_tokens().len();
            let after = prefill + self.drafts_for(&w.spec) + 1;
            let fits_count = count < budget.max_running;
            let fits_tokens = joined == 0 || tokens + prefill <= budget.max_batched_tokens;
            let fits_kv = budget.kv_tokens.is_none_or(|cap| kv + after <= cap);
            if !(fits_count && fits_tokens && fits_kv) {
                break;
            }
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            if w.spec.max_new_tokens == 0 {
                // A static batch keeps its row layout: the request holds a row it never uses.
                self.finish_unused(w, out, metrics)?;
                joining.push(None);
                continue;
            }
            count += 1;
            joined += 1;
            tokens += prefill;
            kv += after;
            self.admissions += 1;
            if w.out.is_empty() {
                metrics.prompt_tokens += w.spec.prompt.len() as u64;
            }
            joining.push(Some(Slot::joining(w, self.admissions)));
        }
        Ok(joining)
    }

    /// Append the rows [`Scheduler::admit`] returned (the cache has grown by as many).
    pub(crate) fn join(&mut self, rows: Vec<Option<Slot<S>>>) {
        self.rows.extend(rows);
    }
}

impl<S> Slot<S> {
    /// The slot of waiting request `w`, admitted `admitted`-th: its prefill runs in the step
    /// it joins in.
    fn joining(w: Waiting, admitted: u64) -> Self {
        let prefill = w.prefill_tokens();
        Slot {
            id: w.id,
            anchor: w.out.last().copied().unwrap_or(0),
            resumed: !w.out.is_empty(),
            spec: w.spec,
            out: w.out,
            len: 0,
            state: None,
            stale: None,
            pending: (0, Vec::new()),
            joining: Some(prefill),
            admitted,
            usage: w.usage,
            finish: None,
            error: None,
        }
    }
}
