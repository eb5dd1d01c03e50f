//! Structured output in a round (see [`crate::engine::TokenConstraint`]): before the forward,
//! each constrained request's drafts are cut where its grammar refuses them; the allowed set of
//! the positions it verifies is computed (before the forward, or after it for a lazy row, see
//! below); its logits rows are masked to those sets; after the commit the grammar advances over
//! the committed tokens. A request whose grammar allows nothing (or fails) ends with `stop`.
//!
//! **Lazy rows.** A greedy request decides nothing from a position's distribution but its
//! greedy token, and the greedy token of the masked row is the row's own whenever the grammar
//! allows it (the lowest id holding the largest value stays so in any subset that holds it).
//! Such a row asks its grammar one question per verified position after the forward (is the
//! target's greedy token allowed here?) and computes the full allowed set only where the
//! answer is no: a grammar's full set costs a walk over the vocabulary's token trie, its
//! one-token check a step of its lexer. Its output is the eager path's, token for token. One
//! that reports log-probabilities computes the full sets of the positions it emits, after the
//! commit ([`Engine::logprob_rows`]): one per token, not one per verified position. Where the grammar refuses one of its drafts, the tokens the grammar
//! forces from there (its fast-forward: `{"title": "` of a JSON schema) take the refused
//! draft's place and those after it: verified like drafts, they are kept where the target
//! agrees.

use candle_core::Tensor;

use super::Plan;
use crate::drafter::Drafter;
use crate::engine::constraint::{Sets, TokenConstraint, allows, plan_masks};
use crate::engine::engine::Engine;
use crate::engine::output::FinishReason;
use crate::error::Result;
use crate::models::TargetModel;
use crate::sampling::{Floats, Mat, greedy_token};
use crate::view::with_floats;

/// One verified position's allowed set (`None`: its logits stay as they are, a lazy row's
/// position whose greedy token the grammar allows or that the row never reaches).
type PositionMask = Option<Vec<u32>>;

/// A round's allowed sets, per engine row.
pub(super) struct Masks {
    /// Per engine row: the sets of the positions it verifies (`None`: unconstrained).
    rows: Vec<Option<Vec<PositionMask>>>,
    /// Per engine row: the drafts of a lazy row, whose sets wait for the forward
    /// ([`Engine::resolve_masks`]).
    lazy: Vec<Option<Vec<u32>>>,
}

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// The masks of the round's rows (`plan`'s running requests, their drafts cut to what the
    /// grammar accepts, and the joining rows in `first` that sample their first token).
    pub(super) fn constrain(&mut self, plan: Option<&mut Plan>, first: &[usize]) -> Masks {
        let b = self.sched.rows.len();
        let mut masks = Masks {
            rows: vec![None; b],
            lazy: vec![None; b],
        };
        if let Some(p) = plan {
            for j in 0..p.act.len() {
                let n = p.lens[j].min(p.drafts[j].len());
                let drafts = p.drafts[j][..n].to_vec();
                match self.masks_of(p.act[j], &drafts, &mut masks) {
                    Some(Kept::First(kept)) => p.lens[j] = p.lens[j].min(kept),
                    Some(Kept::Replaced(new)) => {
                        p.lens[j] = new.len();
                        p.drafts[j][..new.len()].copy_from_slice(&new);
                    }
                    None => {}
                }
            }
        }
        for &i in first {
            self.masks_of(i, &[], &mut masks);
        }
        masks
    }

    /// Row `i`'s masks after `drafts` into `masks` (nothing when it is unconstrained, or ended
    /// here because its grammar allows nothing). Returns the drafts it verifies: its first
    /// ones, or (a lazy row) the valid ones followed by what the grammar forces in place of
    /// the first refused one, as many as the drafts were.
    fn masks_of(&mut self, i: usize, drafts: &[u32], masks: &mut Masks) -> Option<Kept> {
        let slot = self.sched.rows.get_mut(i)?.as_mut()?;
        let c = slot.spec.constraint.clone()?;
        if slot.spec.sampling.is_greedy() {
            let kept = c.with(|c| c.validate(drafts)).min(drafts.len());
            let mut verified = drafts[..kept].to_vec();
            if kept < drafts.len() {
                let forced = c.with(|c| forced_after(c, &verified));
                verified.extend(forced.into_iter().take(drafts.len() - kept));
            }
            masks.lazy[i] = Some(verified.clone());
            masks.rows[i] = Some(Vec::new());
            return Some(Kept::Replaced(verified));
        }
        match plan_masks(&c, drafts) {
            Ok(m) => {
                let kept = m.len().saturating_sub(1);
                masks.rows[i] = Some(m.into_iter().map(Some).collect());
                Some(Kept::First(kept))
            }
            Err(_) => {
                slot.finish = Some(FinishReason::Stop);
                None
            }
        }
    }

    /// The lazy rows among `rows` given the forward's `logits` (`[B, W, V]`, penalized; row
    /// `i`'s position `m` follows its `m`-th draft): each one's sets where the target's greedy
    /// token is refused, its drafts in `plan` cut after one past which nothing is allowed, and
    /// `stop` for a row whose grammar allows nothing at its first position.
    pub(super) fn resolve_masks(
        &mut self,
        logits: &Tensor,
        masks: &mut Masks,
        rows: &[usize],
        mut plan: Option<&mut Plan>,
    ) -> Result<()> {
        for &i in rows {
            let Some(drafts) = masks.lazy.get_mut(i).and_then(Option::take) else {
                continue;
            };
            let Some(slot) = self.sched.rows.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            let Some(c) = slot.spec.constraint.clone() else {
                continue;
            };
            let n = drafts.len();
            let block = logits.get(i)?.narrow(0, 0, n + 1)?;
            let walk = with_floats(&block, "target logits", |f| {
                let v = f.len() / (n + 1);
                let rows = Mat::new(f, [n + 1, v])?;
                Ok(c.with_sets(|c, sets| lazy_walk(c, sets, &drafts, |m| rows.row(m))))
            })?;
            match walk {
                Walk::Masks(m) => masks.rows[i] = Some(m),
                Walk::Cut(m, kept) => {
                    masks.rows[i] = Some(m);
                    if let Some(p) = plan.as_deref_mut()
                        && let Some(j) = p.act.iter().position(|&a| a == i)
                    {
                        p.lens[j] = p.lens[j].min(kept);
                    }
                }
                Walk::Ended => {
                    masks.rows[i] = None;
                    slot.finish = Some(FinishReason::Stop);
                }
            }
        }
        Ok(())
    }

    /// `logits` (`[B, W, V]`) with each masked position's disallowed tokens at `-inf`: one
    /// `[R, V]` row of additive masks per masked position, added in one `index_add` where the
    /// logits are (the logits themselves when no position is masked).
    pub(super) fn masked(&self, logits: &Tensor, masks: &Masks) -> Result<Tensor> {
        let (b, w, v) = logits.dims3()?;
        let mut index: Vec<u32> = Vec::new();
        let mut add: Vec<f32> = Vec::new();
        for (i, rows) in masks.rows.iter().enumerate().take(b) {
            for (m, mask) in rows.iter().flatten().enumerate().take(w) {
                let Some(mask) = mask else { continue };
                index.push((i * w + m) as u32);
                add.extend((0..v).map(|t| {
                    if allows(mask, t) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
        }
        if index.is_empty() {
            return Ok(logits.clone());
        }
        let r = index.len();
        let dev = logits.device();
        let add = Tensor::from_vec(add, (r, v), dev)?.to_dtype(logits.dtype())?;
        let index = Tensor::from_vec(index, r, dev)?;
        Ok(logits
            .reshape((b * w, v))?
            .index_add(&index, &add, 0)?
            .reshape((b, w, v))?)
    }

    /// Row `i`'s logits at the positions of the `tokens` it emits (`[1, n, V]` from `logits`,
    /// `[B, W, V]`, position 0 first), each masked to its full allowed set, when it is a lazy
    /// row that reports log-probabilities (its sets so far exist only where the target's greedy
    /// token was refused); `None` for any other row. Call it before the row's grammar advances
    /// over `tokens`.
    pub(super) fn logprob_rows(
        &self,
        i: usize,
        logits: &Tensor,
        tokens: &[u32],
    ) -> Result<Option<Tensor>> {
        let Some(slot) = self.sched.rows.get(i).and_then(Option::as_ref) else {
            return Ok(None);
        };
        let (Some(c), Some(_)) = (&slot.spec.constraint, slot.spec.logprobs) else {
            return Ok(None);
        };
        if !slot.spec.sampling.is_greedy() || tokens.is_empty() {
            return Ok(None);
        }
        // Position `m` follows the first `m` tokens; a position past one the grammar refuses
        // (none: the tokens were checked) keeps its logits.
        let sets = plan_masks(c, &tokens[..tokens.len() - 1]).unwrap_or_default();
        let n = tokens.len();
        let rows = logits.get(i)?.narrow(0, 0, n)?;
        let v = rows.dim(1)?;
        let mut add = vec![0f32; n * v];
        for (m, set) in sets.iter().enumerate().take(n) {
            for (t, a) in add[m * v..(m + 1) * v].iter_mut().enumerate() {
                if !allows(set, t) {
                    *a = f32::NEG_INFINITY;
                }
            }
        }
        let add = Tensor::from_vec(add, (n, v), rows.device())?.to_dtype(rows.dtype())?;
        Ok(Some((rows + add)?.unsqueeze(0)?))
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
        if c.commit(tokens).is_err() && slot.finish.is_none() {
            slot.finish = Some(FinishReason::Stop);
        }
    }
}

/// The drafts a constrained row verifies.
enum Kept {
    /// Its first drafts, this many.
    First(usize),
    /// These (no more than it drafted).
    Replaced(Vec<u32>),
}

/// What the grammar forces after `prefix` (valid from its state): its forced tokens, as far as
/// it accepts them. The state is rolled back to where it was.
fn forced_after(c: &mut dyn TokenConstraint, prefix: &[u32]) -> Vec<u32> {
    let mut consumed = 0;
    let mut forced = Vec::new();
    for t in prefix {
        if c.consume(std::slice::from_ref(t)).is_err() {
            break;
        }
        consumed += 1;
    }
    if consumed == prefix.len() {
        forced = c.forced();
        let valid = c.validate(&forced);
        forced.truncate(valid);
    }
    // A rollback that fails leaves the state where the commit's advance reports it.
    let _ = c.rollback(consumed);
    forced
}

/// What a lazy row's walk over its verified positions found.
enum Walk {
    /// The sets of its positions (`None` where the greedy token is allowed).
    Masks(Vec<PositionMask>),
    /// As `Masks`, and nothing is allowed after its draft `kept`: it keeps that many drafts.
    Cut(Vec<PositionMask>, usize),
    /// Its grammar allows nothing at its first position (or fails there): it ends.
    Ended,
}

/// Walk a greedy row's positions as greedy verification does: position `m` (its logits
/// `row(m)`) accepts draft `m` when the masked row's greedy token is that draft, and the row
/// stops at the first position that does not. At each position the target's own greedy token
/// is checked first; only a refused one costs the full allowed set (and the greedy token
/// within it). The constraint is rolled back to where it was.
fn lazy_walk<'a>(
    c: &mut dyn TokenConstraint,
    sets_after: &mut Sets,
    drafts: &[u32],
    row: impl Fn(usize) -> Floats<'a>,
) -> Walk {
    let mut sets = Vec::with_capacity(drafts.len() + 1);
    let mut consumed = 0;
    let mut end = None;
    for m in 0..=drafts.len() {
        let greedy = greedy_token(row(m)) as u32;
        let draft = drafts.get(m).copied();
        let pick = if draft == Some(greedy) || c.validate(&[greedy]) == 1 {
            sets.push(None);
            greedy
        } else {
            // The state has consumed `drafts[..m]` (each the pick before it).
            match sets_after.after(&drafts[..m], || c.allowed()) {
                Ok(mask) if mask.iter().any(|&w| w != 0) => {
                    let pick = masked_greedy(row(m), &mask);
                    sets.push(Some(mask));
                    match pick {
                        Some(t) => t,
                        None => break, // no finite allowed value: verification faults the row
                    }
                }
                _ => {
                    // Nothing allowed here: the row ends (at its first position), or verifies
                    // the drafts before draft m - 1 (`sets` holds positions 0..m).
                    end = Some(m);
                    break;
                }
            }
        };
        if draft != Some(pick) || c.consume(&[pick]).is_err() {
            break;
        }
        consumed += 1;
    }
    // A rollback that fails leaves the state where the commit's advance reports it.
    let _ = c.rollback(consumed);
    match end {
        Some(0) => Walk::Ended,
        Some(m) => Walk::Cut(sets, m - 1),
        None => Walk::Masks(sets),
    }
}

/// The greedy token of `row` among the tokens `mask` allows (`None` when none holds a finite
/// value): the lowest allowed id holding the largest allowed value, what verification picks
/// from the masked row.
fn masked_greedy(row: Floats<'_>, mask: &[u32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (w, &word) in mask.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let t = w * 32 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if t >= row.len() {
                return best.map(|(t, _)| t);
            }
            let x = row.get(t);
            if x > f32::NEG_INFINITY && best.is_none_or(|(_, b)| x > b) {
                best = Some((t as u32, x));
            }
        }
    }
    best.map(|(t, _)| t)
}
