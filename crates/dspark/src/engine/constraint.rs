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
pub struct Constraint(Arc<Mutex<State>>);

/// A constraint's grammar state and the allowed sets computed since its last commit.
struct State {
    grammar: Box<dyn TokenConstraint>,
    sets: Sets,
}

/// The full allowed sets computed since the last commit, by the tokens after the committed
/// state they follow. A round asks for the same sets more than once: drafting inside the
/// grammar at a slot, then verification at the position that follows the same drafts.
#[derive(Default)]
pub(crate) struct Sets(Vec<(Vec<u32>, Vec<u32>)>);

impl Sets {
    /// The set after `prefix`: kept, or `compute`d (and kept when it succeeds).
    pub(crate) fn after(
        &mut self,
        prefix: &[u32],
        compute: impl FnOnce() -> Result<Vec<u32>, String>,
    ) -> Result<Vec<u32>, String> {
        if let Some((_, set)) = self.0.iter().find(|(p, _)| p == prefix) {
            return Ok(set.clone());
        }
        let set = compute()?;
        self.0.push((prefix.to_vec(), set.clone()));
        Ok(set)
    }
}

impl Constraint {
    /// Wrap `c`.
    pub fn new(c: impl TokenConstraint + 'static) -> Self {
        Self(Arc::new(Mutex::new(State {
            grammar: Box::new(c),
            sets: Sets::default(),
        })))
    }

    /// Run `f` on the state (a poisoned lock is recovered: the state is the grammar's own).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut dyn TokenConstraint) -> R) -> R {
        self.with_sets(|c, _| f(c))
    }

    /// Run `f` on the state and the sets computed since the last commit (`f` leaves the state
    /// where it found it).
    pub(crate) fn with_sets<R>(
        &self,
        f: impl FnOnce(&mut dyn TokenConstraint, &mut Sets) -> R,
    ) -> R {
        let mut guard = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let State { grammar, sets } = &mut *guard;
        f(grammar.as_mut(), sets)
    }

    /// Advance over committed `tokens` (the sets computed before no longer apply).
    pub(crate) fn commit(&self, tokens: &[u32]) -> Result<(), String> {
        self.with_sets(|c, sets| {
            *sets = Sets::default();
            c.consume(tokens)
        })
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
        self.with_sets(|c, sets| {
            let mut consumed = 0;
            let set = sets.after(tokens, || {
                for t in tokens {
                    c.consume(std::slice::from_ref(t))?;
                    consumed += 1;
                }
                c.allowed()
            });
            // A state that cannot be rolled back must not be used again for drafting: its
            // request's own checks will find it.
            let undo = c.rollback(consumed);
            undo.ok()
                .and(set.ok())
                .filter(|m| m.iter().any(|&w| w != 0))
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
    c.with_sets(|c, sets| {
        let valid = c.validate(drafts);
        let mut masks = Vec::with_capacity(valid + 1);
        let mut consumed = 0;
        let mut result = Ok(());
        for m in 0..=valid {
            match sets.after(&drafts[..m], || c.allowed()) {
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

    /// Allows tokens in increasing order only (a toy grammar), below `vocab`; counts its full
    /// sets.
    #[derive(Default)]
    struct Rising {
        vocab: usize,
        seen: Vec<u32>,
        sets: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl TokenConstraint for Rising {
        fn allowed(&mut self) -> Result<Vec<u32>, String> {
            self.sets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            ..Rising::default()
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
            ..Rising::default()
        });
        assert!(plan_masks(&end, &[]).is_err());
    }

    /// A round asks for a set once: drafting inside the grammar, then verification after the
    /// same drafts, read the set kept since the last commit; a commit drops them all.
    #[test]
    fn a_set_is_computed_once_between_commits() {
        let rising = Rising {
            vocab: 40,
            seen: vec![3],
            ..Rising::default()
        };
        let count = rising.sets.clone();
        let sets = || count.load(std::sync::atomic::Ordering::Relaxed);
        let c = Constraint::new(rising);
        let after_5 = c.allowed_after(&[5]).unwrap();
        assert!(allows(&after_5, 6) && !allows(&after_5, 5));
        assert_eq!(sets(), 1);
        let masks = plan_masks(&c, &[5, 9]).unwrap();
        assert_eq!(masks[1], after_5);
        assert_eq!(sets(), 3, "after [] and [5, 9] computed, after [5] kept");
        // The state is where it was, and its sets are kept until the commit.
        assert_eq!(c.allowed_after(&[]), Some(masks[0].clone()));
        assert_eq!(sets(), 3);
        c.commit(&[5]).unwrap();
        let now = c.allowed_after(&[]).unwrap();
        assert_eq!(
            now, after_5,
            "after the commit: the set after 5, computed again"
        );
        assert_eq!(sets(), 4);
    }
}
