//! A forward's logits changed by each request's
//! [`Penalties`](crate::engine::Penalties) before they are verified or sampled (and before
//! log-probabilities are read from them): only the touched entries are gathered, edited on the
//! host and added back, one gather and one add on the logits' device; a round with no such
//! request keeps its logits untouched.

use std::collections::HashSet;

use candle_core::{DType, Tensor};

use crate::drafter::Drafter;
use crate::engine::engine::Engine;
use crate::engine::penalties::History;
use crate::error::{Error, Result};
use crate::models::TargetModel;

/// The positions of one row to change: row `row` of the `[B, W, V]` logits, positions `0..n`,
/// where position `m` follows the request's committed tokens and `before[..m]` (the drafts
/// verified ahead of it).
pub(super) struct Positions<'a> {
    pub(super) row: usize,
    pub(super) n: usize,
    pub(super) before: &'a [u32],
}

/// One edited position: the request's row, the tokens before it, the ids it touches.
struct Edit {
    row: usize,
    history: History,
    ids: Vec<u32>,
}

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// `logits` (`[B, W, V]`) with each listed row's request's penalties applied at its
    /// positions (see the module docs).
    pub(super) fn penalized(&self, logits: &Tensor, rows: &[Positions<'_>]) -> Result<Tensor> {
        let (b, w, v) = logits.dims3()?;
        let mut edits: Vec<Edit> = Vec::new();
        let mut index: Vec<u32> = Vec::new();
        for p in rows {
            let Some(slot) = self.sched.rows.get(p.row).and_then(Option::as_ref) else {
                continue;
            };
            let pen = &slot.spec.penalties;
            if !pen.is_active() || p.row >= b || p.n > w || p.before.len() + 1 < p.n {
                continue;
            }
            let mut history = History::of(&slot.out);
            for m in 0..p.n {
                if m > 0 {
                    history.push(p.before[m - 1]);
                }
                let ids = pen.touched(&history, &slot.spec.prompt);
                let base = (p.row * w + m) * v;
                for &id in &ids {
                    index.push(u32::try_from(base + id as usize).map_err(|_| {
                        Error::too_large(
                            "target logits (penalties)",
                            (b * w * v) as u128,
                            u64::from(u32::MAX),
                            " values",
                        )
                    })?);
                }
                edits.push(Edit {
                    row: p.row,
                    history: history.clone(),
                    ids,
                });
            }
        }
        if index.is_empty() {
            return Ok(logits.clone());
        }
        let flat = logits.flatten_all()?;
        let count = index.len();
        let at = Tensor::from_vec(index, count, logits.device())?;
        let values = flat
            .index_select(&at, 0)?
            .to_dtype(DType::F32)?
            .to_vec1::<f32>()?;
        let mut delta = Vec::with_capacity(values.len());
        let mut prompt_of: Option<(usize, HashSet<u32>)> = None;
        for e in &edits {
            let Some(slot) = self.sched.rows[e.row].as_ref() else {
                delta.extend(std::iter::repeat_n(0.0, e.ids.len()));
                continue;
            };
            let pen = &slot.spec.penalties;
            if prompt_of.as_ref().is_none_or(|(r, _)| *r != e.row) {
                let set = if pen.repetition != 1.0 {
                    slot.spec.prompt.iter().copied().collect()
                } else {
                    HashSet::new()
                };
                prompt_of = Some((e.row, set));
            }
            let in_prompt = prompt_of.as_ref().map(|(_, s)| s);
            for &id in &e.ids {
                let x = values[delta.len()];
                let hit = in_prompt.is_some_and(|s| s.contains(&id));
                let y = pen.edit(id, x, &e.history, hit);
                // A masked (or NaN) entry keeps its value: its delta would be NaN.
                delta.push(if x.is_finite() && y.is_finite() {
                    y - x
                } else {
                    0.0
                });
            }
        }
        let delta =
            Tensor::from_vec(delta, at.dims1()?, logits.device())?.to_dtype(logits.dtype())?;
        Ok(flat.index_add(&at, &delta, 0)?.reshape((b, w, v))?)
    }
}
