//! After a round's verification: each request commits what it kept (its usage, the engine's
//! counters and acceptance record follow), and the drafter contexts take the target features
//! of the kept positions (now, or pending until the request next proposes).

use std::time::Instant;

use super::Plan;
use crate::drafter::Drafter;
use crate::engine::engine::Engine;
use crate::engine::output::ConfidenceRecord;
use crate::engine::output::StepOutput;
use crate::engine::scheduler::feature_rows;
use crate::error::Result;
use crate::models::{TargetModel, TargetOutput};
use crate::sampling::Verification;

/// Most target-feature rows a request keeps pending for its drafter context: past it they
/// are appended at once (the memory they hold is bounded; a long plain stretch pays its
/// extension in calls of this size).
pub const PENDING_CAP: usize = 256;

/// Most bytes of target features a request keeps pending (with [`PENDING_CAP`]): on a wide
/// target (an 8 B model captures 5 layers of 4096 values, 80 KiB a row in f32) fewer rows.
pub const PENDING_BYTES: usize = 8 << 20;

/// The rows of `[rows, width]` features of `dtype` a request may keep pending.
pub(super) fn pending_cap(width: usize, dtype: candle_core::DType) -> usize {
    let row = width.saturating_mul(dtype.size_in_bytes()).max(1);
    (PENDING_BYTES / row).clamp(1, PENDING_CAP)
}

/// Append a request's pending features (`start`, the position of the first row, and the
/// parts in order) to its drafter context `state`, in one call (none when nothing is pending).
pub(super) fn append_pending<D: Drafter>(
    drafter: &D,
    state: &mut D::State,
    (start, parts): (usize, Vec<candle_core::Tensor>),
) -> Result<()> {
    let feats = match parts.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        _ => candle_core::Tensor::cat(&parts, 0)?,
    };
    drafter.extend(state, &feats, start)
}

/// What one request committed in a round.
pub(super) struct Committed {
    /// The tokens it kept (a stop id or its budget may cut the verified ones short).
    pub(super) tokens: Vec<u32>,
    /// How many.
    pub(super) kept: usize,
    /// Of its verified drafts, how many it accepted and kept.
    pub(super) accepted: usize,
}

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// Commit request `j` of the round (`p.act[j]`) from `v`.
    pub(super) fn commit(
        &mut self,
        j: usize,
        p: &Plan,
        v: &Verification,
        out: &mut StepOutput,
    ) -> Committed {
        let i = p.act[j];
        let n = p.lens[j];
        let emitted: Vec<u32> = v.emitted(j).iter().map(|&t| t as u32).collect();
        let Some(slot) = self.sched.rows[i].as_mut() else {
            return Committed {
                tokens: Vec::new(),
                kept: 0,
                accepted: 0,
            };
        };
        if let Some(&last) = emitted.last() {
            slot.anchor = last;
        }
        let kept = slot.push(&emitted);
        let accepted = (v.num_accepted[j] as usize).min(kept);
        slot.usage.rounds += 1;
        slot.usage.drafted_tokens += n;
        slot.usage.accepted_tokens += accepted;
        let confidence = p.confidence[j].as_deref();
        if self.config.record_confidence
            && let Some(c) = confidence
        {
            let verdict = v.num_accepted[j] as usize;
            for (k, &confidence) in c.iter().enumerate().take((verdict + 1).min(n)) {
                out.confidence_records.push(ConfidenceRecord {
                    position: k as u32,
                    confidence,
                    accepted: k < verdict,
                });
            }
        }
        self.planner.observe_acceptance(n, accepted, confidence);
        let m = &mut self.metrics;
        m.generation_tokens += kept as u64;
        if n > 0 {
            m.num_drafts += 1;
            m.num_draft_tokens += n as u64;
            m.num_accepted_tokens += accepted as u64;
            if m.num_accepted_tokens_per_pos.len() < n {
                m.num_accepted_tokens_per_pos.resize(n, 0);
            }
            for k in 0..accepted {
                m.num_accepted_tokens_per_pos[k] += 1;
            }
        }
        Committed {
            tokens: emitted[..kept].to_vec(),
            kept,
            accepted,
        }
    }

    /// Extend the round's drafter contexts with the features of each request's kept
    /// positions (`kept[row]`), after any rows still pending. A request that proposed this
    /// round extends now; one that did not (a plain round, or no draft left in its budget)
    /// keeps them pending for its next proposal (one extension of many rows then, and none at
    /// all if it never proposes again), until they pass [`pending_cap`] rows. Returns the
    /// seconds spent in the drafter.
    pub(super) fn extend_round(
        &mut self,
        p: &Plan,
        o: &TargetOutput,
        kept: &[usize],
    ) -> Result<f64> {
        let t = Instant::now();
        for (j, &i) in p.act.iter().enumerate() {
            let Some(slot) = self.sched.rows[i].as_mut() else {
                continue;
            };
            if slot.error.is_some() {
                continue; // it failed this round and leaves at the end of the step
            }
            let Some(state) = slot.state.as_mut() else {
                continue;
            };
            let feats = o.hidden_states.get(i)?.narrow(0, 0, kept[i])?;
            if slot.pending.1.is_empty() {
                slot.pending.0 = slot.len;
            }
            let cap = pending_cap(feats.dim(1)?, feats.dtype());
            let over = feature_rows(&slot.pending.1) + kept[i] > cap;
            if !(p.drafted.get(j).copied().unwrap_or(false) || over) {
                // A copy: a view would keep the whole round's features alive while pending.
                slot.pending.1.push(feats.force_contiguous()?);
                continue;
            }
            // Pending rows first, then this round's, in one call.
            slot.pending.1.push(feats);
            append_pending(&self.drafter, state, std::mem::take(&mut slot.pending))?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Give each joining request that drafts a drafter context holding its prefill's features
    /// (`rows` tokens each). Returns the seconds spent in the drafter.
    pub(super) fn extend_joining(
        &mut self,
        join: &[usize],
        o: &TargetOutput,
        rows: &[Vec<u32>],
    ) -> Result<f64> {
        let t = Instant::now();
        for &i in join {
            let drafts = match &self.sched.rows[i] {
                Some(s) if s.error.is_none() => self.sched.drafts_for(&s.spec),
                _ => continue,
            };
            if drafts == 0 {
                continue;
            }
            let mut state = self.drafter.new_state()?;
            let feats = o.hidden_states.get(i)?.narrow(0, 0, rows[i].len())?;
            // Under a scheduling policy the prefill's features wait for the request's first
            // proposal: a batch where drafting does not pay never spends them.
            let defer = self.planner.schedules()
                && rows[i].len() <= pending_cap(feats.dim(1)?, feats.dtype());
            if !defer {
                self.drafter.extend(&mut state, &feats, 0)?;
            }
            if let Some(slot) = self.sched.rows[i].as_mut() {
                slot.state = Some(state);
                if defer {
                    slot.pending = (0, vec![feats.force_contiguous()?]);
                }
            }
        }
        Ok(t.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pending_cap_bounds_rows_and_bytes() {
        use candle_core::DType;
        // A narrow target: the row cap.
        assert_eq!(pending_cap(64, DType::F32), PENDING_CAP);
        // An 8 B target's 5 x 4096 f32 values a row: 8 MiB / 80 KiB.
        assert_eq!(pending_cap(5 * 4096, DType::F32), 102);
        assert_eq!(pending_cap(5 * 4096, DType::BF16), 204);
        // Never below one row.
        assert_eq!(pending_cap(usize::MAX / 2, DType::F32), 1);
    }
}
