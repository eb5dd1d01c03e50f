//! Planning the draft-to-target id map from the checkpoint's `d2t` table.
//!
//! Reduced drafters (`V_d < V_t`) must ship `d2t`; its header length is checked against `V_d`
//! first, then it is read (the one tensor-data read of validation) and validated by
//! [`IdMap::from_offsets`]. Full and padded drafters map by
//! identity; an all-zero `d2t` they happen to ship is the identity too and is not loaded.

use super::names::D2T_CANONICAL;
use super::plan::Builder;
use crate::error::Error;
use crate::idmap::IdMap;

impl Builder<'_> {
    /// Decide `plan.id_map` (and whether `d2t` is loaded), reporting `missing-d2t`, a `d2t` that
    /// is not one-dimensional, `bad-dtype`, and the `d2t-*` validation errors.
    pub(super) fn plan_id_map(&mut self) {
        let b = self;
        let vocab = b.plan.vocab;
        let Some(&info) = b.found.get(D2T_CANONICAL) else {
            if vocab.needs_d2t() {
                b.problems.push(Error::MissingD2t {
                    draft: vocab.draft,
                    target: vocab.target,
                });
            }
            return;
        };
        b.consumed.insert(D2T_CANONICAL.to_string());
        if info.shape.len() != 1 {
            b.problems.push(Error::ShapeMismatch {
                tensor: info.name.clone(),
                expected: vec![vocab.draft],
                found: info.shape.clone(),
            });
            return;
        }
        // The header's length is checked before any data is read: a header may claim any size.
        if info.shape[0] != vocab.draft {
            b.problems.push(Error::D2tWrongLength {
                expected: vocab.draft,
                found: info.shape[0],
            });
            return;
        }
        let offsets = match b.inventory.read_i64(&info.name) {
            Ok(offsets) => offsets,
            Err(e) => {
                b.problems.push(e);
                return;
            }
        };
        if !vocab.needs_d2t() && offsets.iter().all(|&o| o == 0) {
            // Identity offsets on a full or padded drafter: nothing to map.
            b.plan.ignored.push(info.name.clone());
            return;
        }
        match IdMap::from_offsets(&offsets, vocab.draft, vocab.target) {
            Ok(map) => {
                b.plan.id_map = map;
                b.plan
                    .tensors
                    .insert(D2T_CANONICAL.to_string(), info.name.clone());
            }
            Err(e) => b.problems.push(e),
        }
    }
}
