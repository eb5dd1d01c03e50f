//! Structured output in a round (see [`crate::engine::TokenConstraint`]): before the forward,
//! each constrained request's drafts are cut where its grammar refuses them and the allowed
//! set of every position it verifies is computed; after the forward its logits rows are masked
//! to those sets; after the commit the grammar advances over the committed tokens. A request
//! whose grammar allows nothing (or fails) ends with `stop`.

use candle_core::Tensor;

use super::Plan;
use crate::drafter::Drafter;
use crate::engine::constraint::{allows, plan_masks};
use crate::engine::engine::Engine;
use crate::engine::output::FinishReason;
use crate::error::Result;
use crate::models::TargetModel;

/// Per engine row: the allowed sets of the positions it verifies (`None`: unconstrained).
pub(super) type Masks = Vec<Option<Vec<Vec<u32>>>>;

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// The masks of the round's rows (`plan`'s running requests, their drafts cut to what the
    /// grammar accepts, and the joining rows in `first` that sample their first token).
    pub(super) fn constrain(&mut self, plan: Option<&mut Plan>, first: &[usize]) -> Masks {
        let mut masks: Masks = vec![None; self.sched.rows.len()];
        if let Some(p) = plan {
            for (j, &i) in p.act.iter().enumerate() {
                let n = p.lens[j];
                let drafts = &p.drafts[j][..n.min(p.drafts[j].len())];
                let Some(m) = self.masks_of(i, drafts) else {
                    continue;
                };
                p.lens[j] = n.min(m.len().saturating_sub(1));
                masks[i] = Some(m);
            }
        }
        for &i in first {
            masks[i] = self.masks_of(i, &[]);
        }
        masks
    }

    /// Row `i`'s masks after `drafts` (`None` when it is unconstrained, or ended here because
    /// its grammar allows nothing).
    fn masks_of(&mut self, i: usize, drafts: &[u32]) -> Option<Vec<Vec<u32>>> {
        let slot = self.sched.rows.get_mut(i)?.as_mut()?;
        let c = slot.spec.constraint.clone()?;
        match plan_masks(&c, drafts) {
            Ok(m) => Some(m),
            Err(_) => {
                slot.finish = Some(FinishReason::Stop);
                None
            }
        }
    }

    /// `logits` (`[B, W, V]`) with each masked row's disallowed tokens at `-inf`.
    pub(super) fn masked(&self, logits: &Tensor, masks: &Masks) -> Result<Tensor> {
        if masks.iter().all(Option::is_none) {
            return Ok(logits.clone());
        }
        let (b, w, v) = logits.dims3()?;
        let mut add = vec![0f32; b * w * v];
        for (i, rows) in masks.iter().enumerate().take(b) {
            for (m, mask) in rows.iter().flatten().enumerate().take(w) {
                let row = &mut add[(i * w + m) * v..(i * w + m + 1) * v];
                for (t, x) in row.iter_mut().enumerate() {
                    if !allows(mask, t) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let add = Tensor::from_vec(add, (b, w, v), logits.device())?.to_dtype(logits.dtype())?;
        Ok(logits.add(&add)?)
    }

    /// Advance row `i`'s grammar over the tokens it committed (a grammar that refuses them
    /// ends the request with `stop`).
    pub(super) fn advance(&mut self, i: usize, tokens: &[u32]) {
        let Some(slot) = self.sched.rows.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let Some(c) = slot.spec.constraint.clone() else {
            return;
        };
        if tokens.is_empty() {
            return;
        }
        if c.with(|c| c.consume(tokens)).is_err() && slot.finish.is_none() {
            slot.finish = Some(FinishReason::Stop);
        }
    }
}
