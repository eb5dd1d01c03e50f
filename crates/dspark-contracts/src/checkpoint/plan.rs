//! The load plan: which weights a drafter takes from its checkpoint and which from its target.
//!
//! [`LoadPlan::build`] classifies every checkpoint tensor ([`super::names`]), checks every
//! present tensor's shape against the config ([`super::shapes`]), applies the vocabulary
//! predicate ([`VocabSizes`]) and the confidence-head rule, and reports every problem at once.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::header::TensorInfo;
use super::inventory::Inventory;
use super::names::{self, DROP_TARGET_OWNED, NameRule};
use super::shapes::{self, Expected, Need};
use crate::config::{ConfigFormat, DraftSpec, TargetSpec};
use crate::error::Warning;
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::vocab::{VocabLayout, VocabSizes};

/// Warning code: a padded drafter without its own lm_head shares the target's.
pub const W_PADDED_SHARED_LM_HEAD: &str = "padded-shared-lm-head";
/// Warning code: a checkpoint tensor the config does not account for (not loaded).
pub const W_UNEXPECTED_TENSOR: &str = "unexpected-tensor";
/// Warning code: the config enables the confidence head but the checkpoint lacks it.
pub const W_CONFIDENCE_HEAD_DISABLED: &str = "confidence-head-disabled";
/// Warning code: the checkpoint ships a confidence head the config disables.
pub const W_CONFIDENCE_HEAD_IGNORED: &str = "confidence-head-ignored";

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
    /// Canonical parameter name → checkpoint tensor name, for every tensor to load. Stacked
    /// slots are keyed `canonical[i]` (DeepSeek-V4 `w1` → `...gate_up_proj.weight[0]`).
    pub tensors: BTreeMap<String, String>,
    /// Checkpoint tensors deliberately not loaded (`t2d`, `mask_embedding`, unexpected, ...).
    pub ignored: Vec<String>,
    /// Number of target-owned tensors skipped (DeepSeek-V4 names outside `mtp.*`); counted,
    /// not listed.
    pub target_owned: usize,
    /// Non-fatal findings.
    pub warnings: Vec<Warning>,
}

/// Working state of [`LoadPlan::build`].
pub(super) struct Builder<'a> {
    pub(super) spec: &'a DraftSpec,
    pub(super) inventory: &'a Inventory,
    /// key → tensor, for every tensor classified as loadable.
    pub(super) found: BTreeMap<String, &'a TensorInfo>,
    /// keys a rule has decided about.
    pub(super) consumed: BTreeSet<String>,
    pub(super) plan: LoadPlan,
    pub(super) problems: Vec<Error>,
}

impl<'a> Builder<'a> {
    /// Canonical keys found in the checkpoint that no rule has consumed yet.
    pub(super) fn leftovers(&self) -> Vec<String> {
        self.found
            .keys()
            .filter(|k| !self.consumed.contains(*k))
            .cloned()
            .collect()
    }

    fn new(spec: &'a DraftSpec, target: &TargetSpec, inventory: &'a Inventory) -> Self {
        let vocab = spec.vocab(target.vocab_size);
        Self {
            spec,
            inventory,
            found: BTreeMap::new(),
            consumed: BTreeSet::new(),
            plan: LoadPlan {
                vocab,
                embed_tokens: WeightSource::SharedTarget,
                lm_head: WeightSource::SharedTarget,
                // `V_t` comes from a parsed (bounded) target config.
                id_map: IdMap::Identity {
                    target_vocab: vocab.target,
                },
                confidence_head: false,
                tensors: BTreeMap::new(),
                ignored: Vec::new(),
                target_owned: 0,
                warnings: Vec::new(),
            },
            problems: Vec::new(),
        }
    }

    pub(super) fn warn(&mut self, code: &'static str, message: String) {
        self.plan.warnings.push(Warning::new(code, message));
    }

    /// Classify every checkpoint tensor: dropped ones go to `ignored` (or the target-owned
    /// count), loadable ones to `found`; two names with one canonical key are an error.
    fn classify_all(&mut self) {
        let format = self.spec.format;
        for info in self.inventory.tensors() {
            let rule = names::classify(&info.name, format);
            let Some(key) = rule.key() else {
                match rule {
                    NameRule::Drop {
                        reason: DROP_TARGET_OWNED,
                    } => self.plan.target_owned += 1,
                    _ => self.plan.ignored.push(info.name.clone()),
                }
                continue;
            };
            if let Some(prev) = self.found.get(&key) {
                self.problems.push(Error::BadSafetensors {
                    path: self.inventory.root.clone(),
                    message: format!(
                        "tensors `{}` and `{}` both map to parameter `{key}`",
                        prev.name, info.name
                    ),
                });
                continue;
            }
            self.found.insert(key, info);
        }
    }

    /// Look up an expected tensor; when present, check its shape and mark it decided.
    pub(super) fn check(&mut self, exp: &Expected) -> Option<&'a TensorInfo> {
        let info = *self.found.get(&exp.canonical)?;
        self.consumed.insert(exp.canonical.clone());
        if info.shape != exp.shape {
            self.problems.push(Error::ShapeMismatch {
                tensor: info.name.clone(),
                expected: exp.shape.clone(),
                found: info.shape.clone(),
            });
        }
        Some(info)
    }

    /// Check an expected tensor and plan to load it when present; report it when required.
    pub(super) fn require(&mut self, exp: &Expected) -> bool {
        match self.check(exp) {
            Some(info) => {
                self.plan
                    .tensors
                    .insert(exp.canonical.clone(), info.name.clone());
                true
            }
            None => {
                if let Need::Required(reason) = exp.need {
                    self.problems.push(Error::MissingTensor {
                        tensor: exp.checkpoint.clone(),
                        reason: reason.to_string(),
                    });
                }
                false
            }
        }
    }

    /// Whether the checkpoint ships the shareable weight `exp` ([`Self::require`]); when it
    /// does not and the vocabulary `needs` the drafter's own, `missing` is a problem.
    fn ships(&mut self, exp: &Expected, needs: bool, missing: impl FnOnce() -> Error) -> bool {
        if self.require(exp) {
            return true;
        }
        if needs {
            self.problems.push(missing());
        }
        false
    }

    pub(super) fn ignore(&mut self, key: &str) {
        if let Some(info) = self.found.get(key) {
            self.plan.ignored.push(info.name.clone());
            self.consumed.insert(key.to_string());
        }
    }

    /// Confidence head: on when enabled and present; enabled but absent → off, loudly;
    /// present but disabled → ignored, with a warning. `bias_required` for Qwen3 heads.
    pub(super) fn confidence(&mut self, expected: &[Expected], bias_required: bool) {
        let find = |name: &str| expected.iter().find(|e| e.canonical == name).cloned();
        let (Some(weight), Some(bias)) = (
            find(shapes::CONFIDENCE_WEIGHT),
            find(shapes::CONFIDENCE_BIAS),
        ) else {
            return;
        };
        let has_weight = self.found.contains_key(&weight.canonical);
        let has_bias = self.found.contains_key(&bias.canonical);
        match (self.spec.confidence_head, has_weight || has_bias) {
            (true, true) => {
                let weight = Expected {
                    need: Need::Required("the confidence head bias is present without its weight"),
                    ..weight
                };
                let bias = Expected {
                    need: if bias_required {
                        Need::Required(shapes::WHY_CONFIDENCE_BIAS)
                    } else {
                        Need::Optional
                    },
                    ..bias
                };
                self.plan.confidence_head = self.require(&weight);
                self.require(&bias);
            }
            (true, false) => self.warn(
                W_CONFIDENCE_HEAD_DISABLED,
                format!(
                    "enable_confidence_head is true but the checkpoint has no `{}`: the \
                     confidence head is OFF and confidence-scheduled verification falls back",
                    weight.checkpoint
                ),
            ),
            (false, true) => {
                self.ignore(&weight.canonical);
                self.ignore(&bias.canonical);
                self.warn(
                    W_CONFIDENCE_HEAD_IGNORED,
                    "the checkpoint ships a confidence head but enable_confidence_head is \
                     false: it is not loaded"
                        .into(),
                );
            }
            (false, false) => {}
        }
    }

    fn finish(self) -> Result<LoadPlan> {
        Error::collect(self.problems)?;
        Ok(self.plan)
    }
}

impl LoadPlan {
    /// Apply the name rules, the vocabulary predicate and the shape checks. Every problem is
    /// reported ([`Error::Multiple`] when there are several).
    pub fn build(spec: &DraftSpec, target: &TargetSpec, inventory: &Inventory) -> Result<Self> {
        let mut b = Builder::new(spec, target, inventory);
        b.classify_all();
        match spec.format {
            ConfigFormat::DeepSeekV4 => b.plan_dsv4(),
            ConfigFormat::DeepSpec | ConfigFormat::Speculators | ConfigFormat::DFlash => {
                build_qwen3(&mut b)
            }
        }
        b.finish()
    }
}

fn build_qwen3(b: &mut Builder<'_>) {
    let expected = shapes::qwen3_expected(b.spec);
    let vocab = b.plan.vocab;
    for exp in &expected {
        match exp.canonical.as_str() {
            shapes::CONFIDENCE_WEIGHT | shapes::CONFIDENCE_BIAS => {}
            shapes::EMBED => {
                let missing = || Error::MissingEmbedTokens {
                    input: vocab.input,
                    target: vocab.target,
                };
                if b.ships(exp, vocab.needs_own_embed(), missing) {
                    b.plan.embed_tokens = WeightSource::Own;
                }
            }
            shapes::LM_HEAD => {
                let missing = || Error::MissingLmHead {
                    draft: vocab.draft,
                    target: vocab.target,
                };
                let needed = vocab.needs_own_lm_head();
                if b.ships(exp, needed, missing) {
                    b.plan.lm_head = WeightSource::Own;
                } else if !needed && vocab.layout() == VocabLayout::Padded {
                    b.warn(
                        W_PADDED_SHARED_LM_HEAD,
                        format!(
                            "padded drafter (draft_vocab_size {} > target vocab {}) ships no \
                             lm_head: the target's is shared and rows [{}, {}) are masked",
                            vocab.draft, vocab.target, vocab.target, vocab.draft
                        ),
                    );
                }
            }
            _ => {
                b.require(exp);
            }
        }
    }
    b.confidence(&expected, true);
    b.plan_id_map();
    // Borrowed from the inventory (not cloned keys): a huge checkpoint stays cheap here.
    let leftovers: Vec<&TensorInfo> = b
        .found
        .iter()
        .filter(|(k, _)| !b.consumed.contains(*k))
        .map(|(_, &info)| info)
        .collect();
    let extra = leftovers.len().saturating_sub(MAX_UNEXPECTED_WARNINGS);
    for (i, info) in leftovers.into_iter().enumerate() {
        let name = info.name.clone();
        if i < MAX_UNEXPECTED_WARNINGS {
            b.warn(
                W_UNEXPECTED_TENSOR,
                format!("`{name}` is not part of this drafter's config; it is not loaded"),
            );
        }
        b.plan.ignored.push(name);
    }
    if extra > 0 {
        b.warn(
            W_UNEXPECTED_TENSOR,
            format!(
                "{extra} more tensors are not part of this drafter's config; they are not loaded"
            ),
        );
    }
}

/// Unexpected tensors named one warning each; the rest are summed up in one more (a huge
/// checkpoint must not make the report huge).
const MAX_UNEXPECTED_WARNINGS: usize = 64;
