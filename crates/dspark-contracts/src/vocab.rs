//! Vocabulary sizes and the one layout predicate.
//!
//! Three sizes matter: `V_in` (draft input vocabulary: embedding rows, Markov `W1` rows),
//! `V_d` (draft output vocabulary: lm_head rows, Markov `W2` rows, `d2t` length) and `V_t`
//! (the target's logical vocabulary). Every path that builds or loads a drafter asks
//! [`VocabSizes`] — never compares the sizes itself — so construction and loading cannot
//! disagree about what a checkpoint must contain.

use serde::Serialize;

/// How the draft output vocabulary relates to the target vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VocabLayout {
    /// `V_d == V_t`: identity id map.
    Full,
    /// `V_d > V_t`: rows `[V_t, V_d)` are padding, masked before sampling; identity id map.
    Padded,
    /// `V_d < V_t`: a pruned draft vocabulary, mapped to target ids by `d2t`.
    Reduced,
}

impl VocabLayout {
    /// The stable lowercase name (`"full"`, `"padded"`, `"reduced"`).
    pub fn as_str(self) -> &'static str {
        match self {
            VocabLayout::Full => "full",
            VocabLayout::Padded => "padded",
            VocabLayout::Reduced => "reduced",
        }
    }
}

impl std::fmt::Display for VocabLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The three vocabulary sizes of a drafter/target pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct VocabSizes {
    /// `V_in`: draft input vocabulary (`vocab_size`).
    pub input: usize,
    /// `V_d`: draft output vocabulary (`draft_vocab_size`, falling back to `vocab_size`).
    pub draft: usize,
    /// `V_t`: target logical vocabulary (the target config's `vocab_size`).
    pub target: usize,
}

impl VocabSizes {
    /// Bundle the three sizes.
    pub fn new(input: usize, draft: usize, target: usize) -> Self {
        Self {
            input,
            draft,
            target,
        }
    }

    /// Bundle the three sizes, refusing any above [`crate::limits::MAX_VOCAB`] (`too-large`
    /// naming `input_vocab`, `draft_vocab` or `target_vocab`). The entry point for sizes that
    /// come from a caller rather than a parsed (already bounded) config.
    pub fn try_new(input: usize, draft: usize, target: usize) -> crate::Result<Self> {
        use crate::limits::{MAX_VOCAB, at_most};
        Ok(Self {
            input: at_most("input_vocab", input as u64, MAX_VOCAB)?,
            draft: at_most("draft_vocab", draft as u64, MAX_VOCAB)?,
            target: at_most("target_vocab", target as u64, MAX_VOCAB)?,
        })
    }

    /// The predicate: a draft vocabulary is reduced iff `V_d < V_t`.
    pub fn is_reduced(&self) -> bool {
        self.draft < self.target
    }

    /// The layout implied by the sizes.
    pub fn layout(&self) -> VocabLayout {
        if self.is_reduced() {
            VocabLayout::Reduced
        } else if self.draft > self.target {
            VocabLayout::Padded
        } else {
            VocabLayout::Full
        }
    }

    /// `V_in > V_t`: the drafter embeds ids the target cannot, so it needs its own embedding.
    pub fn expanded_input(&self) -> bool {
        self.input > self.target
    }

    /// A reduced drafter must ship its own lm_head (the target's has the wrong rows).
    pub fn needs_own_lm_head(&self) -> bool {
        self.is_reduced()
    }

    /// A reduced drafter must ship `d2t`.
    pub fn needs_d2t(&self) -> bool {
        self.is_reduced()
    }

    /// An expanded-input drafter must ship its own `embed_tokens`.
    pub fn needs_own_embed(&self) -> bool {
        self.expanded_input()
    }

    /// Number of padded draft rows `[V_t, V_d)` that must be masked before sampling.
    pub fn padded_rows(&self) -> usize {
        self.draft.saturating_sub(self.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inkling_small_is_padded_identity() {
        let v = VocabSizes::new(201_024, 201_024, 200_058);
        assert_eq!(v.layout(), VocabLayout::Padded);
        assert!(!v.needs_d2t() && !v.needs_own_lm_head());
        assert_eq!(v.padded_rows(), 966);
        // V_in > V_t too: the padded input rows need the draft's own embedding.
        assert!(v.needs_own_embed());
    }

    #[test]
    fn try_new_bounds_every_size() {
        assert_eq!(
            VocabSizes::try_new(10, 8, 9).ok(),
            Some(VocabSizes::new(10, 8, 9))
        );
        for (sizes, name) in [
            ((1 << 40, 1, 1), "input_vocab"),
            ((1, usize::MAX, 1), "draft_vocab"),
            ((1, 1, (1 << 22) + 1), "target_vocab"),
        ] {
            let e = VocabSizes::try_new(sizes.0, sizes.1, sizes.2).unwrap_err();
            assert_eq!(e.code(), "too-large");
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn layouts() {
        assert_eq!(VocabSizes::new(100, 100, 100).layout(), VocabLayout::Full);
        assert_eq!(VocabSizes::new(100, 40, 100).layout(), VocabLayout::Reduced);
        assert!(VocabSizes::new(100, 40, 100).needs_d2t());
        assert!(!VocabSizes::new(100, 101, 100).needs_d2t());
        assert!(VocabSizes::new(101, 100, 100).expanded_input());
        assert_eq!(VocabLayout::Reduced.to_string(), "reduced");
    }
}
