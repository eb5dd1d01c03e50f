//! The load plan: which weights a drafter takes from its checkpoint and which from its target.

use std::collections::BTreeMap;

use serde::Serialize;

use super::inventory::Inventory;
use crate::Warning;
use crate::config::{DraftSpec, TargetSpec};
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::vocab::VocabSizes;

/// Where a weight comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightSource {
    /// The drafter checkpoint ships it.
    Own,
    /// It is taken from the target model.
    SharedTarget,
}

/// How to load a drafter: the result of applying every checkpoint rule.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    /// The three vocabulary sizes.
    pub vocab: VocabSizes,
    /// Source of `embed_tokens`.
    pub embed_tokens: WeightSource,
    /// Source of `lm_head`.
    pub lm_head: WeightSource,
    /// The validated draft-to-target id map.
    pub id_map: IdMap,
    /// Whether the confidence head is on (enabled in the config *and* its weights present).
    pub confidence_head: bool,
    /// Canonical parameter name → checkpoint tensor name, for every tensor to load.
    pub tensors: BTreeMap<String, String>,
    /// Checkpoint tensors deliberately not loaded (`t2d`, `mask_embedding`, target-owned, ...).
    pub ignored: Vec<String>,
    /// Non-fatal findings.
    pub warnings: Vec<Warning>,
}

impl LoadPlan {
    /// Apply the name rules, the vocabulary predicate and the shape checks. Every problem is
    /// reported ([`Error::Multiple`] when there are several).
    pub fn build(spec: &DraftSpec, target: &TargetSpec, inventory: &Inventory) -> Result<Self> {
        let _ = (spec, target, inventory);
        Err(Error::invalid("plan", "not implemented yet"))
    }
}
