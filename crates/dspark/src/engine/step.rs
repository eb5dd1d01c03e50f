//! [`Engine::step`]: the scheduler's aborts, preemption and admission, one round, then what
//! finished.

use std::time::Instant;

use super::engine::Engine;
use super::output::StepOutput;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::models::TargetModel;

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
        self.sched.apply_aborts(&mut out, &mut self.metrics)?;
        self.sched.finish_empty(&mut out, &mut self.metrics)?;
        self.compact()?;
        if self.sched.preempt(&mut self.metrics) {
            self.compact()?;
        }
        let joining = self.sched.admit(&mut out, &mut self.metrics)?;
        if !joining.is_empty() {
            match self.cache.as_mut() {
                None => self.cache = Some(self.target.new_cache(joining.len())?),
                Some(cache) => self.target.grow(cache, joining.len())?,
            }
            self.sched.join(joining);
        }
        if self.sched.num_running() > 0 {
            // Decode-sized work runs inline on this thread (see `crate::threads`).
            crate::threads::in_round(|| self.round(&mut out))?;
        }
        self.sched.finish(&mut out, &mut self.metrics)?;
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
}
