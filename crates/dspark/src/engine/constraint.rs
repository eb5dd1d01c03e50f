//! Structured output: a request's [`TokenConstraint`] (a grammar's state over the target
//! vocabulary) decides which tokens may come next.
//!
//! A request drafts inside its constraint (a [`BlockGuide`]: see
//! [`crate::drafter::guide`]). Each round, before the target forward, the engine cuts a
//! request's drafts at the first one the constraint refuses, and computes the allowed set at
//! every verified position (the constraint advanced over the drafts before it, then rolled
//! back; a greedy request computes it after the forward, and only where the target's greedy
//! token is refused or, for its log-probabilities, where it emits a token:
//! `round/constrain.rs`). The target's logits are masked to those sets (after penalties), so
//! verification, sampling and log-probabilities all follow the target restricted to the
//! grammar: greedy output is target-only greedy under the
//! same grammar, and output is always in the grammar. Committed tokens then advance the
//! constraint. The engine knows no grammar engine: the server supplies one (llguidance).

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::drafter::BlockGuide;

/// A grammar's state over the target vocabulary.
pub trait TokenConstraint: Send {
    /// The tokens allowed next: a bitmask of `ceil(V / 32)` words (bit `v % 32` of word
    /// `v / 32` set when token `v` is allowed). An empty set (a grammar that dead-ends) ends
    /// the request; an implementation that prefers to end it with an end-of-sequence token
    /// allows that token alone.
    fn allowed(&mut self) -> Result<Vec<u32>, String>;
    /// How many of `tokens`, in order, the constraint accepts from its state (unchanged).
    /// `validate(&[t]) == 1` exactly when [`allowed`](Self::allowed) holds `t`: a greedy
    /// request asks this of the target's greedy token and computes the full set only when it
    /// is refused.
    fn validate(&mut self, tokens: &[u32]) -> usize;
    /// Advance over `tokens` (each allowed).
    fn consume(&mut self, tokens: &[u32]) -> Result<(), String>;
    /// Undo the last `n` tokens consumed.
    fn rollback(&mut self, n: usize) -> Result<(), String>;
    /// Tokens the grammar forces next from its state, in order (text that is the only way on,
    /// tokenized; none by default). A greedy request verifies them in place of drafts the
    /// grammar refuses: verification decides, so a guess the target would not take costs only
    /// its positions.
    fn forced(&mut self) -> Vec<u32> {
        Vec::new()
    }
}

/// A request's constraint, shared by its clones (a spec is cloned when it is queued; the state
/// is one).
#[derive(Clone)]
pub struct Constraint(pub(crate) Arc<Mutex<Box<dyn TokenConstraint>>>);

impl Constraint {
    /// Wrap `c`.
    pub fn new(c: impl TokenConstraint + 'static) -> Self {
        Self(Arc::new(Mutex::new(Box::new(c))))
    }

    /// Run `f` on the state (a poisoned lock is recovered: the state is the grammar's own).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut dyn TokenConstraint) -> R) -> R {
        let mut guard = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(guard.as_mut())
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint(..)")
    }
}

impl PartialEq for Constraint {
    /// The same state.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A request's constraint guides its greedy drafts ([`crate::drafter::guide`]): a block is
/// checked from the committed state, and the state is left as it was.
impl BlockGuide for Constraint {
    fn accepts(&self, tokens: &[u32]) -> usize {
        self.with(|c| c.validate(tokens))
    }

    fn allowed_after(&self, tokens: &[u32]) -> Option<Vec<u32>> {
        self.with(|c| {
            let mut consumed = 0;
            let mut mask = None;
            if tokens.iter().all(|t| {
                let ok = c.consume(std::slice::from_ref(t)).is_ok();
                consumed += usize::from(ok);
                ok
            }) {
                mask = c.allowed().ok().filter(|m| m.iter().any(|&w| w != 0));
            }
            // A state that cannot be rolled back must not be used again for drafting: its
            // request's own checks will find it.
            c.rollback(consumed).ok().and(mask)
        })
    }
}

/// Whether token `v` is in `mask`.
pub(crate) fn allows(mask: &[u32], v: usize) -> bool {
    mask.get(v / 32).is_some_and(|w| w >> (v % 32) & 1 == 1)
}

/// The allowed sets of the positions a request verifies: position `m` follows `drafts[..m]`.
/// Cuts `drafts` at the first the constraint refuses, and at a draft after which nothing is
/// allowed. Returns the sets (one more than the drafts kept), or the error of a constraint
/// that cannot say (position 0 included: the request then ends).
pub(crate) fn plan_masks(c: &Constraint, drafts: &[u32]) -> Result<Vec<Vec<u32>>, String> {
    c.with(|c| {
        let valid = c.validate(drafts);
        let mut masks = Vec::with_capacity(valid + 1);
        let mut consumed = 0;
        let mut result = Ok(());
        for m in 0..=valid {
            match c.allowed() {
                Ok(mask) if mask.iter().any(|&w| w != 0) => masks.push(mask),
                Ok(_) if m == 0 => {
                    result = Err("the grammar allows no token here".to_string());
                    break;
                }
                Ok(_) => break,
                Err(e) if m == 0 => {
                    result = Err(e);
                    break;
                }
                Err(_) => break,
            }
            if m < valid {
                if let Err(e) = c.consume(&drafts[m..m + 1]) {
                    if m == 0 {
                        result = Err(e);
                    }
                    break;
                }
                consumed += 1;
            }
        }
        // Positions past a failing one are not verified: drop their masks.
        masks.truncate(consumed + 1);
        let undo = c.rollback(consumed);
        result?;
        undo?;
        Ok(masks)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allows tokens in increasing order only (a toy grammar), below `vocab`.
    struct Rising {
        vocab: usize,
        seen: Vec<u32>,
    }

    impl TokenConstraint for Rising {
        fn allowed(&mut self) -> Result<Vec<u32>, String> {
            let from = self.seen.last().map_or(0, |&t| t as usize + 1);
            let mut mask = vec![0u32; self.vocab.div_ceil(32)];
            for v in from..self.vocab {
                mask[v / 32] |= 1 << (v % 32);
            }
            Ok(mask)
        }
        fn validate(&mut self, tokens: &[u32]) -> usize {
            let mut last = self.seen.last().map(|&t| t as i64).unwrap_or(-1);
            tokens
                .iter()
                .take_while(|&&t| {
                    let ok = i64::from(t) > last && (t as usize) < self.vocab;
                    last = i64::from(t);
                    ok
                })
                .count()
        }
        fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
            self.seen.extend_from_slice(tokens);
            Ok(())
        }
        fn rollback(&mut self, n: usize) -> Result<(), String> {
            let keep = self.seen.len() - n;
            self.seen.truncate(keep);
            Ok(())
        }
    }

    #[test]
    fn drafts_are_cut_at_the_first_refused_and_masks_follow_the_drafts() {
        let c = Constraint::new(Rising {
            vocab: 40,
            seen: vec![3],
        });
        let masks = plan_masks(&c, &[5, 9, 7, 20]).unwrap();
        assert_eq!(masks.len(), 3, "5 and 9 kept, 7 refused");
        assert!(allows(&masks[0], 4) && !allows(&masks[0], 3));
        assert!(allows(&masks[1], 6) && !allows(&masks[1], 5));
        assert!(allows(&masks[2], 10) && !allows(&masks[2], 9));
        // The state is rolled back.
        assert_eq!(c.with(|c| c.validate(&[4])), 1);
        // Nothing allowed after 39: the draft is cut there; nothing at all ends the request.
        let masks = plan_masks(&c, &[39, 39]).unwrap();
        assert_eq!(masks.len(), 1);
        let end = Constraint::new(Rising {
            vocab: 40,
            seen: vec![39],
        });
        assert!(plan_masks(&end, &[]).is_err());
    }
}
