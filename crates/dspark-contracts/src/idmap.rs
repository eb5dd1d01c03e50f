//! The draft-to-target id map.
//!
//! `d2t` is an offset table: `target = draft + d2t[draft]`; all zeros is the identity.
//! An [`IdMap`] is validated once, on construction: every mapped id lies in `[0, V_t)` and no
//! two draft ids share a target id. After that, [`IdMap::to_target`] cannot fail.

use crate::error::{Error, Result};
use crate::limits::{MAX_VOCAB, at_most};

/// Maps draft-vocabulary ids to target-vocabulary ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdMap {
    /// Draft id == target id (full and padded vocabularies).
    Identity {
        /// `V_t`: ids at or above it are never emitted (padded rows are masked).
        target_vocab: usize,
    },
    /// A validated offset table (reduced vocabularies).
    Table {
        /// `targets[d]` = `d + d2t[d]`, precomputed.
        targets: Vec<u32>,
        /// `V_t`.
        target_vocab: usize,
    },
}

impl IdMap {
    /// The identity map over a target vocabulary of `target_vocab` ids.
    ///
    /// Errors: `too-large` (naming `target_vocab`) above [`MAX_VOCAB`].
    pub fn identity(target_vocab: usize) -> Result<Self> {
        let target_vocab = at_most("target_vocab", target_vocab as u64, MAX_VOCAB)?;
        Ok(IdMap::Identity { target_vocab })
    }

    /// The map a block-sampling call implies, from its optional `d2t` offsets and target
    /// vocabulary: with `d2t`, the validated offset table (the target vocabulary is then
    /// required: `invalid-argument` naming `target_vocab_size`); without, the identity over the
    /// target vocabulary (the draft vocabulary when none is named), except that a target
    /// vocabulary larger than the draft's is `missing-d2t` (a reduced vocabulary needs its map).
    pub fn for_call(
        d2t: Option<&[i64]>,
        draft_vocab: usize,
        target_vocab: Option<usize>,
    ) -> Result<Self> {
        match (d2t, target_vocab) {
            (Some(offsets), Some(tv)) => IdMap::from_offsets(offsets, draft_vocab, tv),
            (Some(_), None) => Err(Error::invalid(
                "target_vocab_size",
                "required when d2t is given",
            )),
            (None, Some(tv)) if tv > draft_vocab => Err(Error::MissingD2t {
                draft: draft_vocab,
                target: tv,
            }),
            (None, tv) => IdMap::identity(tv.unwrap_or(draft_vocab)),
        }
    }

    /// Build and validate a map from a `d2t` offset table of length `draft_vocab`.
    ///
    /// Errors: `d2t-wrong-length`, `too-large` (either vocabulary above [`MAX_VOCAB`]),
    /// `d2t-out-of-range`, `d2t-duplicate` (the first problem of each kind is reported; all
    /// kinds found are returned together).
    pub fn from_offsets(offsets: &[i64], draft_vocab: usize, target_vocab: usize) -> Result<Self> {
        if offsets.len() != draft_vocab {
            return Err(Error::D2tWrongLength {
                expected: draft_vocab,
                found: offsets.len(),
            });
        }
        at_most("d2t", draft_vocab as u64, MAX_VOCAB)?;
        at_most("target_vocab", target_vocab as u64, MAX_VOCAB)?;
        let mut targets = Vec::with_capacity(draft_vocab);
        let mut problems = Vec::new();
        for (draft_id, &offset) in offsets.iter().enumerate() {
            let mapped = (draft_id as i64).checked_add(offset);
            match mapped
                .and_then(|t| usize::try_from(t).ok())
                .filter(|&t| t < target_vocab)
            {
                Some(t) => targets.push(t as u32),
                None => {
                    if problems.is_empty() {
                        problems.push(Error::D2tOutOfRange {
                            draft_id,
                            target_id: mapped.unwrap_or(i64::MAX),
                            target_vocab,
                        });
                    }
                    targets.push(u32::MAX);
                }
            }
        }
        // Uniqueness with one bit per target id: `V_t <= MAX_VOCAB`, so at most 512 KiB.
        // The first draft id that repeats a target is reported with the earliest one.
        let mut seen = vec![0u64; target_vocab.div_ceil(64)];
        for (d, &t) in targets.iter().enumerate() {
            if t == u32::MAX {
                continue;
            }
            let (word, bit) = (t as usize / 64, 1u64 << (t % 64));
            if seen[word] & bit != 0 {
                let first = targets.iter().position(|&x| x == t).unwrap_or(d);
                problems.push(Error::D2tDuplicate {
                    first,
                    second: d,
                    target_id: t as usize,
                });
                break;
            }
            seen[word] |= bit;
        }
        Error::collect(problems)?;
        Ok(IdMap::Table {
            targets,
            target_vocab,
        })
    }

    /// `true` for the identity map.
    pub fn is_identity(&self) -> bool {
        matches!(self, IdMap::Identity { .. })
    }

    /// `"identity"` or `"offset-table"` (the `inspect --json` spelling).
    pub fn kind_str(&self) -> &'static str {
        if self.is_identity() {
            "identity"
        } else {
            "offset-table"
        }
    }

    /// `V_t`.
    pub fn target_vocab(&self) -> usize {
        match self {
            IdMap::Identity { target_vocab } | IdMap::Table { target_vocab, .. } => *target_vocab,
        }
    }

    /// Number of draft ids this map can translate (`None` for the identity: any id below `V_t`).
    pub fn draft_vocab(&self) -> Option<usize> {
        match self {
            IdMap::Identity { .. } => None,
            IdMap::Table { targets, .. } => Some(targets.len()),
        }
    }

    /// Map one draft id; `None` when the id has no target (outside the table or `>= V_t`).
    #[inline]
    pub fn to_target(&self, draft_id: usize) -> Option<u32> {
        match self {
            // Checked conversion: an id beyond `u32` never wraps onto a small one.
            IdMap::Identity { target_vocab } => u32::try_from(draft_id)
                .ok()
                .filter(|_| draft_id < *target_vocab),
            IdMap::Table { targets, .. } => targets.get(draft_id).copied(),
        }
    }

    /// The table `targets[d]` for an offset map, `None` for the identity.
    pub fn table(&self) -> Option<&[u32]> {
        match self {
            IdMap::Identity { .. } => None,
            IdMap::Table { targets, .. } => Some(targets),
        }
    }

    /// The offset form `d2t[d] = target(d) - d`, as stored in checkpoints (`None` for identity).
    pub fn offsets(&self) -> Option<Vec<i64>> {
        self.table().map(|t| {
            t.iter()
                .enumerate()
                .map(|(d, &x)| i64::from(x) - d as i64)
                .collect()
        })
    }

    /// Inverse lookup: the draft id of a target id, if any (linear for tables; used off the hot path).
    pub fn to_draft(&self, target_id: usize) -> Option<usize> {
        match self {
            IdMap::Identity { target_vocab } => (target_id < *target_vocab).then_some(target_id),
            IdMap::Table { targets, .. } => targets.iter().position(|&t| t as usize == target_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zeros_are_identity_like() {
        let m = IdMap::from_offsets(&[0, 0, 0], 3, 10).unwrap();
        assert_eq!(
            (0..3).map(|d| m.to_target(d).unwrap()).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(m.kind_str(), "offset-table");
        assert_eq!(m.offsets().unwrap(), [0, 0, 0]);
    }

    #[test]
    fn errors_have_codes() {
        assert_eq!(
            IdMap::from_offsets(&[0, 0], 3, 10).unwrap_err().code(),
            "d2t-wrong-length"
        );
        assert_eq!(
            IdMap::from_offsets(&[0, 9], 2, 10).unwrap_err().code(),
            "d2t-out-of-range"
        );
        assert_eq!(
            IdMap::from_offsets(&[-1, 0], 2, 10).unwrap_err().code(),
            "d2t-out-of-range"
        );
        assert_eq!(
            IdMap::from_offsets(&[1, 0], 2, 10).unwrap_err().code(),
            "d2t-duplicate"
        );
        assert_eq!(
            IdMap::from_offsets(&[i64::MAX, 0], 2, 10)
                .unwrap_err()
                .code(),
            "d2t-out-of-range"
        );
        let both = IdMap::from_offsets(&[1, 0, 100], 3, 10).unwrap_err();
        assert_eq!(both.code(), "multiple");
        assert_eq!(both.problems().len(), 2);
    }

    #[test]
    fn vocabularies_above_the_limit_are_too_large() {
        // A large V_t within the limit costs O(V_t / 8) bytes of validation at most.
        let big = MAX_VOCAB as usize;
        let m = IdMap::from_offsets(&[0, 7], 2, big).unwrap();
        assert_eq!(m.to_target(1), Some(8));
        let e = IdMap::from_offsets(&[5, 4], 2, big).unwrap_err();
        assert_eq!(e.code(), "d2t-duplicate");
        for vt in [big + 1, u32::MAX as usize, usize::MAX] {
            let e = IdMap::from_offsets(&[0], 1, vt).unwrap_err();
            assert_eq!(e.code(), "too-large");
            assert!(e.to_string().contains("target_vocab"), "{e}");
            assert_eq!(IdMap::identity(vt).unwrap_err().code(), "too-large");
        }
    }

    #[test]
    fn ids_beyond_u32_never_wrap() {
        // An id past u32 must not wrap (2**32 + 5 must never map to 5).
        assert_eq!(IdMap::identity(1 << 33).unwrap_err().code(), "too-large");
        let forged = IdMap::Identity {
            target_vocab: 1 << 33,
        };
        assert_eq!(forged.to_target((1 << 32) + 5), None);
        assert_eq!(forged.to_target(5), Some(5));
    }

    #[test]
    fn duplicates_name_the_first_draft_id() {
        let e = IdMap::from_offsets(&[2, 0, 0, -3], 4, 10).unwrap_err();
        match e {
            Error::D2tDuplicate {
                first,
                second,
                target_id,
            } => assert_eq!((first, second, target_id), (0, 2, 2)),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn identity_rejects_padded_ids() {
        let m = IdMap::identity(5).unwrap();
        assert_eq!(m.to_target(4), Some(4));
        assert_eq!(m.to_target(5), None);
        assert!(m.offsets().is_none());
    }

    proptest! {
        /// Any injective choice of target ids round-trips through the offset form, and
        /// perturbing one entry onto another's target is always caught.
        #[test]
        fn offset_table_roundtrip(target_vocab in 1usize..400, seed in any::<u64>(), frac in 0.05f64..1.0) {
            let draft_vocab = ((target_vocab as f64 * frac) as usize).max(1);
            // Deterministic shuffle of 0..target_vocab, take the first draft_vocab.
            let mut ids: Vec<usize> = (0..target_vocab).collect();
            let mut s = seed | 1;
            for i in (1..ids.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                ids.swap(i, (s % (i as u64 + 1)) as usize);
            }
            ids.truncate(draft_vocab);
            let offsets: Vec<i64> = ids.iter().enumerate().map(|(d, &t)| t as i64 - d as i64).collect();
            let m = IdMap::from_offsets(&offsets, draft_vocab, target_vocab).unwrap();
            for (d, &t) in ids.iter().enumerate() {
                prop_assert_eq!(m.to_target(d), Some(t as u32));
                prop_assert_eq!(m.to_draft(t), Some(d));
            }
            prop_assert_eq!(m.offsets().unwrap(), offsets.clone());
            if draft_vocab >= 2 {
                let mut dup = offsets.clone();
                dup[1] = ids[0] as i64 - 1;
                prop_assert_eq!(IdMap::from_offsets(&dup, draft_vocab, target_vocab).unwrap_err().code(), "d2t-duplicate");
            }
            let mut oob = offsets;
            oob[0] = target_vocab as i64;
            prop_assert_eq!(IdMap::from_offsets(&oob, draft_vocab, target_vocab).unwrap_err().code(), "d2t-out-of-range");
        }
    }
}
