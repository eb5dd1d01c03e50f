//! Making room and letting requests in: the KV budget preempts the newest running requests
//! when the running batch cannot take its next round, and admits waiting requests, oldest
//! first, while the running count, the step's new tokens and the KV budget allow.

use super::engine::Engine;
use super::output::StepOutput;
use super::slot::Slot;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::target::TargetModel;

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// KV tokens running request `slot` may hold by the end of its next round: its cache
    /// row plus one verified block.
    fn kv_need(&self, slot: &Slot<D::State>) -> usize {
        slot.len + self.drafts_for(&slot.spec) + 1
    }

    /// Preempt the newest running requests until every other one's next round fits the KV
    /// budget (continuous engines with a KV budget only). A preempted request drops its
    /// cache row and drafter context and waits at the front of the queue, keeping what it
    /// committed; it resumes by re-prefilling it.
    pub(super) fn preempt(&mut self) -> Result<()> {
        let Some(cap) = self.config.budget.kv_tokens.filter(|_| self.continuous) else {
            return Ok(());
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
            self.metrics.preemptions += 1;
            self.waiting.push_front(slot.into_waiting());
            preempted = true;
        }
        if preempted {
            self.compact()?;
        }
        Ok(())
    }

    /// Admit waiting requests, oldest first, while they fit: at most `max_running` running,
    /// the step's new tokens (every running request's block, the joining prefills) within
    /// `max_batched_tokens` (a first joining prefill always fits: it was checked alone), and
    /// the KV budget. A static batch admits only when the engine is empty.
    pub(super) fn admit(&mut self, out: &mut StepOutput) -> Result<()> {
        if self.waiting.is_empty() || (!self.continuous && !self.rows.is_empty()) {
            return Ok(());
        }
        let budget = self.config.budget;
        let running: Vec<&Slot<D::State>> = self.rows.iter().flatten().collect();
        let mut count = running.len();
        let mut tokens: usize = running.iter().map(|s| self.drafts_for(&s.spec) + 1).sum();
        let mut kv: usize = running.iter().map(|s| self.kv_need(s)).sum();
        let mut joined = 0;
        let mut joining_rows = Vec::new();
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
                self.finish_unused(w, out)?;
                joining_rows.push(None);
                continue;
            }
            count += 1;
            joined += 1;
            tokens += prefill;
            kv += after;
            let prefill_ids = w.prefill_tokens();
            let resumed = !w.out.is_empty();
            self.admissions += 1;
            if !resumed {
                self.metrics.prompt_tokens += w.spec.prompt.len() as u64;
            }
            joining_rows.push(Some(Slot {
                id: w.id,
                anchor: w.out.last().copied().unwrap_or(0),
                spec: w.spec,
                out: w.out,
                len: 0,
                state: None,
                stale: None,
                pending: (0, Vec::new()),
                joining: Some(prefill_ids),
                resumed,
                admitted: self.admissions,
                usage: w.usage,
                finish: None,
                error: None,
            }));
        }
        if joining_rows.is_empty() {
            return Ok(());
        }
        match self.cache.as_mut() {
            None => self.cache = Some(self.target.new_cache(joining_rows.len())?),
            Some(cache) => self.target.grow(cache, joining_rows.len())?,
        }
        self.rows.extend(joining_rows);
        Ok(())
    }
}
