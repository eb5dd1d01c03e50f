//! What a drafted block follows slot by slot: each request's presence and frequency penalties
//! inside the block ([`InBlockPenalty`]) and the guides of a greedy call, read by the slot-by-slot
//! draw ([`super::in_block`]) and by the split of a call into the rows that follow something and
//! those that do not ([`super::split`]).

use super::guide::Guide;

/// One request's presence and frequency penalties inside a drafted block (drawn as
/// [`super::in_block`] says).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InBlockPenalty {
    /// Subtracted once from a token drafted in the block that is not in `seen`.
    pub presence: f32,
    /// Subtracted once per time a token is drafted in the block.
    pub frequency: f32,
    /// The TARGET ids the request generated before the block, sorted and distinct (their own
    /// penalties come through [`ProposeOptions::logit_bias`](super::ProposeOptions)).
    pub seen: Vec<u32>,
}

impl InBlockPenalty {
    /// Whether drafting a token changes later slots.
    pub fn is_active(&self) -> bool {
        self.presence != 0.0 || self.frequency != 0.0
    }

    /// What drafting target id `t` once more subtracts at later slots: the frequency penalty,
    /// plus the presence penalty when `t` was generated nowhere before (`drafted` = how many
    /// times earlier slots of the block drafted it).
    pub(crate) fn step(&self, t: u32, drafted: u32) -> f32 {
        let new = drafted == 0 && self.seen.binary_search(&t).is_err();
        self.frequency + if new { self.presence } else { 0.0 }
    }
}

/// Whether any request of `pens` is active.
pub(crate) fn any_active(pens: &[InBlockPenalty]) -> bool {
    pens.iter().any(InBlockPenalty::is_active)
}

/// What a drafting call's block follows slot by slot: the in-block penalties (one per request,
/// or none), the guides of a greedy call, and the drafter's target-to-draft id lookup.
pub(crate) struct Follow<'a> {
    pub(crate) pens: &'a [InBlockPenalty],
    pub(crate) guides: Option<&'a [Option<Guide>]>,
    pub(crate) to_draft: &'a [u32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_counts_only_tokens_new_to_the_request() {
        let p = InBlockPenalty {
            presence: 0.5,
            frequency: 0.25,
            seen: vec![3, 7],
        };
        assert_eq!(p.step(3, 0), 0.25, "generated before the block");
        assert_eq!(p.step(4, 0), 0.75, "first time anywhere");
        assert_eq!(p.step(4, 1), 0.25, "drafted before in the block");
        assert!(!InBlockPenalty::default().is_active());
    }
}
