//! A round's plan for its running requests: whether it drafts at all, the proposals (one
//! drafter call per draft temperature), and how many drafts each request verifies. The
//! choices are the [`Planner`](crate::policy::Planner)'s (the drafting decision is described
//! there); this module gathers what it reads from the requests and applies what it decides.
//!
//! A request whose own limit (`max_drafts`, its budget) leaves no draft, or that never drafts,
//! takes a target-only step inside a drafted round. A sampled request whose tokens must repeat
//! with its seed (`RequestSpec::repeatable`) makes its rounds draft and verifies its whole
//! block under the scheduling policies, as under full verification.

use std::time::Instant;

use super::Plan;
use super::commit::append_pending;
use crate::drafter::Drafter;
use crate::engine::engine::Engine;
use crate::engine::output::StepOutput;
use crate::engine::scheduler::Scheduler;
use crate::error::Result;
use crate::models::TargetModel;
use crate::policy::Drafting;

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// The plan of this round for the running rows `act`.
    pub(super) fn plan_round(&mut self, act: Vec<usize>, out: &mut StepOutput) -> Result<Plan> {
        // Each request's own limit: its max_drafts and its budget (a round commits at most
        // drafts + 1 tokens).
        let caps: Vec<usize> = act
            .iter()
            .map(|&i| match &self.sched.rows[i] {
                Some(s) if s.state.is_some() => self
                    .sched
                    .drafts_for(&s.spec)
                    .min(s.budget_left().saturating_sub(1)),
                _ => 0,
            })
            .collect();
        let drafting: Vec<usize> = (0..act.len()).filter(|&j| caps[j] > 0).collect();
        // Sampled requests whose tokens must repeat with their seed: their rounds draft and
        // they verify their whole block (see `RequestSpec::repeatable`).
        let schedules = self.planner.schedules();
        let pinned: Vec<bool> = act
            .iter()
            .map(|&i| {
                schedules
                    && self.sched.rows[i]
                        .as_ref()
                        .is_some_and(|s| s.spec.repeatable && !s.spec.sampling.is_greedy())
            })
            .collect();
        let measured = self.planner.round_table(&self.target, drafting.len())?;
        let rows: Vec<usize> = drafting.iter().map(|&j| act[j]).collect();
        // `explored`: the planner's choice was a refresh (read where it chose, never stale).
        let (choice, explored) = if drafting.iter().any(|&j| pinned[j]) {
            self.planner.drafting_forced();
            (Drafting::All, false)
        } else if drafting.is_empty() {
            (Drafting::Plain, false)
        } else {
            let remaining = rows
                .iter()
                .filter_map(|&i| self.sched.rows[i].as_ref().map(|s| s.budget_left()))
                .max()
                .unwrap_or(0);
            let choice =
                self.planner
                    .drafts(&stale(&self.sched, &rows), measured.as_ref(), remaining)?;
            (choice, self.planner.explored())
        };
        let plain = choice == Drafting::Plain && !drafting.is_empty();
        let drafting = match choice {
            Drafting::Probe if !drafting.is_empty() => vec![self.probed(&act, &drafting)],
            _ => drafting,
        };
        let mut plan = Plan {
            lens: vec![0; act.len()],
            drafts: vec![Vec::new(); act.len()],
            q: None,
            confidence: vec![None; act.len()],
            drafted: vec![false; act.len()],
            plain,
            probe: choice == Drafting::Probe,
            explored,
            propose_seconds: 0.0,
            flush_seconds: 0.0,
            act,
        };
        if plain || drafting.is_empty() {
            return Ok(plan);
        }
        let t = Instant::now();
        let flushed = self.flush_pending(&plan, &drafting)?;
        let k = self.propose(&mut plan, &drafting)?;
        let seconds = t.elapsed().as_secs_f64();
        plan.propose_seconds = seconds - flushed;
        plan.flush_seconds = flushed;
        out.timing.drafter_seconds += seconds;
        // A request that failed proposing ends alone (it verifies nothing).
        let drafting: Vec<usize> = drafting.into_iter().filter(|&j| plan.drafted[j]).collect();
        if drafting.is_empty() {
            return Ok(plan);
        }
        let lens = self.verify_lengths(&plan, &drafting, k, measured.as_ref())?;
        let whole = self.num_speculative.min(k);
        for (&j, len) in drafting.iter().zip(lens) {
            let len = if pinned[j] { whole } else { len };
            plan.lens[j] = len.min(caps[j]);
        }
        self.planner.decay();
        Ok(plan)
    }

    /// The request (an index into `act`, one of `drafting`) a probe round drafts: the first
    /// without confidences, else each in turn.
    fn probed(&mut self, act: &[usize], drafting: &[usize]) -> usize {
        let fresh = drafting.iter().copied().find(|&j| {
            self.sched.rows[act[j]]
                .as_ref()
                .is_some_and(|s| s.stale.is_none())
        });
        let turn = self.planner.next_probe();
        fresh.unwrap_or_else(|| drafting[turn % drafting.len().max(1)])
    }

    /// Append the pending features of the requests `drafting` (indices into `plan.act`) to
    /// their drafter contexts, before they propose. Returns the seconds it took.
    fn flush_pending(&mut self, plan: &Plan, drafting: &[usize]) -> Result<f64> {
        let t = Instant::now();
        for &j in drafting {
            let Some(slot) = self.sched.rows[plan.act[j]].as_mut() else {
                continue;
            };
            let pending = std::mem::take(&mut slot.pending);
            if let Some(state) = slot.state.as_mut() {
                append_pending(&self.drafter, state, pending)?;
            }
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Drafts to verify per drafting request (`drafting`, indices into `plan.act`): the
    /// planner's choice over blocks of `k` (capped later by each request's own limit). The
    /// requests keep the confidences it read as their next round's `stale`.
    fn verify_lengths(
        &mut self,
        plan: &Plan,
        drafting: &[usize],
        k: usize,
        measured: Option<&crate::policy::StepsPerSecond>,
    ) -> Result<Vec<usize>> {
        let n = self.num_speculative.min(k);
        let confidence: Option<Vec<f32>> = drafting
            .iter()
            .map(|&j| plan.confidence[j].as_ref().map(|c| c[..n].to_vec()))
            .collect::<Option<Vec<_>>>()
            .map(|rows| rows.concat());
        let rows: Vec<usize> = drafting.iter().map(|&j| plan.act[j]).collect();
        let (lens, firsts) = self.planner.verify_lengths(
            &self.target,
            confidence,
            &stale(&self.sched, &rows),
            k,
            measured,
        )?;
        if let Some(firsts) = firsts {
            for (r, &i) in rows.iter().enumerate() {
                if let Some(s) = self.sched.rows[i].as_mut() {
                    s.stale = Some(firsts[r * n..(r + 1) * n].to_vec());
                }
            }
        }
        Ok(lens)
    }
}

/// The previous-round confidences of the running rows `rows`.
fn stale<'a, S>(sched: &'a Scheduler<S>, rows: &[usize]) -> Vec<Option<&'a [f32]>> {
    rows.iter()
        .map(|&i| sched.rows[i].as_ref().and_then(|s| s.stale.as_deref()))
        .collect()
}
