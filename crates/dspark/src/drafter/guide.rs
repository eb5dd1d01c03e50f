//! [`ProposeOptions::guides`](super::ProposeOptions): a block drafted inside a grammar.
//!
//! Under structured output the engine cuts a request's drafts at the first one its grammar
//! refuses, and the round verifies nothing past it. A drafter that never saw the grammar's
//! language (a JSON schema's keys, say) proposes such tokens often: on the bundled pair under
//! a JSON schema, four rounds in ten verified no draft at all. A guided greedy block checks
//! each slot's token against the request's guide as it is drawn; where the guide refuses it,
//! the slot is drawn again from the drafter's logits restricted to what the guide allows
//! there (the argmax among the allowed tokens), and the later slots follow the new token
//! through the Markov head. The guide's full set is computed only at a refused slot: a
//! grammar's one-token check is a step of its lexer, its full set a walk over the vocabulary.
//!
//! A sampled draft is drawn from the distribution it reports, which a redraw after a refusal
//! would not be: a sampled block restricts every guided slot before it is drawn (the full set
//! at each slot), so each slot's reported distribution is the drafter's restricted to the
//! grammar, and verification stays exact.

use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::idmap::IdMap;
use crate::sampling::{BlockOptions, DraftBlock, Floats, Mat, Rows3, Seeds, sample_block_slices};

/// What a request's drafted block may hold, from the request's committed state.
pub trait BlockGuide: Send + Sync {
    /// How many of `tokens` (TARGET ids, the block from its first slot), in order, are allowed.
    fn accepts(&self, tokens: &[u32]) -> usize;
    /// The TARGET ids allowed after `tokens` (each allowed), as a bitmask of `ceil(V_t / 32)`
    /// words (bit `v % 32` of word `v / 32`); `None` when the guide cannot say.
    fn allowed_after(&self, tokens: &[u32]) -> Option<Vec<u32>>;
}

/// A shared [`BlockGuide`] (cloned with its options; compared by identity).
#[derive(Clone)]
pub struct Guide(Arc<dyn BlockGuide>);

impl Guide {
    /// Wrap `g`.
    pub fn new(g: impl BlockGuide + 'static) -> Self {
        Self(Arc::new(g))
    }
}

impl fmt::Debug for Guide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Guide(..)")
    }
}

impl PartialEq for Guide {
    /// The same guide.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The guided rows of one greedy drafting call: per request, its guide while it still follows
/// one (a row whose guide could not say, or allowed nothing the drafter can draw, drafts on
/// unguided: the engine cuts its block there).
pub(crate) struct Guided {
    guides: Vec<Option<Guide>>,
    /// A sampled call: every slot restricted before it is drawn, none checked after.
    ahead: bool,
}

impl Guided {
    /// The guides of a call with `b_n` requests (`None` when no row has one); `ahead` for a
    /// sampled call.
    pub(crate) fn new(guides: Option<&[Option<Guide>]>, b_n: usize, ahead: bool) -> Option<Self> {
        let guides = guides?;
        if guides.iter().all(Option::is_none) {
            return None;
        }
        let mut guides = guides.to_vec();
        guides.resize(b_n, None);
        Some(Self { guides, ahead })
    }

    /// Before a sampled call draws a slot: row `b`'s base logits `row` (`V_d`) restricted in
    /// place to what its guide allows after `drafted` (a row whose guide cannot say, or leaves
    /// nothing drawable, is unguided from here). Returns whether `row` changed. Nothing for a
    /// greedy call.
    pub(crate) fn restrict_ahead(
        &mut self,
        b: usize,
        drafted: &[u32],
        row: &mut [f32],
        map: &IdMap,
    ) -> bool {
        if !self.ahead {
            return false;
        }
        let Some(g) = self.guides.get(b).and_then(Option::as_ref) else {
            return false;
        };
        match g
            .0
            .allowed_after(drafted)
            .and_then(|m| restrict(row, &m, map))
        {
            Some(r) => {
                row.copy_from_slice(&r);
                true
            }
            None => {
                self.guides[b] = None;
                false
            }
        }
    }

    /// Whether this is a sampled call's (every slot restricted before it is drawn).
    pub(crate) fn ahead(&self) -> bool {
        self.ahead
    }

    /// Row `b` drew `token` after `drafted` (its block so far): `None` when its guide allows
    /// it (or it has none), else the base logits of its slot (`V_d`, fetched by `row` only
    /// then) restricted to what the guide allows in its place. `None` too when the guide cannot
    /// say or leaves nothing the drafter can draw: the row is unguided from here. Nothing for
    /// a sampled call (its slots are restricted before they are drawn).
    pub(crate) fn replacement(
        &mut self,
        b: usize,
        drafted: &[u32],
        token: u32,
        row: impl FnOnce() -> Result<Vec<f32>>,
        map: &IdMap,
    ) -> Result<Option<Vec<f32>>> {
        if self.ahead {
            return Ok(None);
        }
        let Some(g) = self.guides.get(b).and_then(Option::as_ref) else {
            return Ok(None);
        };
        let mut block = drafted.to_vec();
        block.push(token);
        if g.0.accepts(&block) == block.len() {
            return Ok(None);
        }
        let restricted = match g.0.allowed_after(drafted) {
            Some(mask) => restrict(&row()?, &mask, map),
            None => None,
        };
        if restricted.is_none() {
            self.guides[b] = None;
        }
        Ok(restricted)
    }
}

/// Keep a greedy `block` drawn in one pass from `base` (`[B, K, V_d]`, the same call) inside
/// `guided`. Each guided row's drafts are checked together; a row refused at slot `m` is drawn
/// again from there one slot at a time: slot `m` among what its guide allows, each later slot
/// after the new tokens, checked in turn and drawn again among the allowed ones where it is
/// refused. A row its guide allows costs one check.
pub(crate) fn guide_block(
    block: &mut DraftBlock,
    base: &[f32],
    dims: [usize; 3],
    (w1, w2): (Mat<'_>, Mat<'_>),
    anchors: &[u32],
    opts: &BlockOptions<'_>,
    guided: &mut Guided,
) -> Result<()> {
    let [_, k_n, v] = dims;
    let (vt, r) = (block.target_vocab, block.rank);
    for (b, &anchor) in anchors.iter().enumerate() {
        let Some(g) = guided.guides.get(b).and_then(Option::as_ref) else {
            continue;
        };
        let first = g.0.accepts(&block.tokens[b * k_n..(b + 1) * k_n]);
        let one_opts = row_options(opts, b);
        for k in first..k_n {
            let i = b * k_n + k;
            let prev = if k == 0 { anchor } else { block.tokens[i - 1] };
            let slot = &base[i * v..(i + 1) * v];
            let draw = |logits: &[f32]| {
                let rows = Rows3 {
                    data: Floats::F32(logits),
                    dims: [1, 1, v],
                };
                sample_block_slices(rows, w1, w2, &[prev], &one_opts)
            };
            // The refused slot keeps its first draw until its guide says what replaces it;
            // every later one follows the new tokens.
            let mut one = if k == first { None } else { Some(draw(slot)?) };
            let t = one.as_ref().map_or(block.tokens[i], |o| o.tokens[0]);
            let drafted = &block.tokens[b * k_n..i];
            if let Some(logits) =
                guided.replacement(b, drafted, t, || Ok(slot.to_vec()), opts.id_map)?
            {
                one = Some(draw(&logits)?);
            }
            if let Some(o) = one {
                block.tokens[i] = o.tokens[0];
                block.draft_logits[i * vt..(i + 1) * vt].copy_from_slice(&o.draft_logits[..vt]);
                block.prev_embeddings[i * r..(i + 1) * r].copy_from_slice(&o.prev_embeddings[..r]);
            } else if guided.guides[b].is_none() {
                // Its guide gave up on the first refused slot, which stays: so does the rest.
                break;
            }
        }
    }
    Ok(())
}

/// The options of a call that draws row `b` of `opts`'s call alone.
pub(crate) fn row_options<'a>(opts: &BlockOptions<'a>, b: usize) -> BlockOptions<'a> {
    BlockOptions {
        seeds: row_seeds(&opts.seeds, b),
        ..opts.clone()
    }
}

/// `base` (`V_d` draft logits) with `-inf` at every draft id whose target id `mask` refuses;
/// `None` when nothing drawable is left.
fn restrict(base: &[f32], mask: &[u32], map: &IdMap) -> Option<Vec<f32>> {
    let mut out = base.to_vec();
    let mut any = false;
    for (d, x) in out.iter_mut().enumerate() {
        let allowed = map.to_target(d).is_some_and(|t| {
            mask.get(t as usize / 32)
                .is_some_and(|w| w >> (t % 32) & 1 == 1)
        });
        if allowed {
            any |= *x > f32::NEG_INFINITY;
        } else {
            *x = f32::NEG_INFINITY;
        }
    }
    any.then_some(out)
}

/// Row `b`'s seeds, for a call that draws it alone.
fn row_seeds(seeds: &Seeds, b: usize) -> Seeds {
    match seeds {
        Seeds::Scalar(s) => Seeds::Scalar(*s),
        Seeds::PerRequest(v) => Seeds::PerRequest(v.get(b).copied().into_iter().collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricting_keeps_only_allowed_targets_and_says_when_none_is_left() {
        let map = IdMap::identity(40).unwrap();
        let base: Vec<f32> = (0..40).map(|i| i as f32).collect();
        // Tokens 3 and 33 allowed.
        let mask = vec![1 << 3, 1 << 1];
        let out = restrict(&base, &mask, &map).unwrap();
        let kept: Vec<usize> = (0..40).filter(|&d| out[d].is_finite()).collect();
        assert_eq!(kept, vec![3, 33]);
        assert_eq!(out[33], 33.0);
        assert!(restrict(&base, &[0, 0], &map).is_none());
        // An allowed token the drafter already rules out leaves nothing to draw.
        let mut ruled_out = base.clone();
        ruled_out[3] = f32::NEG_INFINITY;
        assert!(restrict(&ruled_out, &[1 << 3, 0], &map).is_none());
    }

    #[test]
    fn a_row_drawn_alone_keeps_its_own_seed() {
        assert_eq!(
            row_seeds(&Seeds::PerRequest(vec![5, 6, 7]), 1),
            Seeds::PerRequest(vec![6])
        );
        assert_eq!(row_seeds(&Seeds::Scalar(9), 2), Seeds::Scalar(9));
    }
}
