//! Planning a DeepSeek-V4 in-checkpoint drafter (`mtp.{stage}.*` inside the target checkpoint).
//!
//! Embedding and lm_head always come from the target and ids map by identity. Model-level
//! tensors (`main_proj`, `main_norm`, the last stage's `norm` and Markov head) are
//! shape-checked; decoder-layer internals (MoE experts, attention) are checked for presence
//! only: every stage `0..n` must hold some.

use super::plan::{Builder, W_UNEXPECTED_TENSOR};
use super::shapes;
use crate::error::Error;

impl Builder<'_> {
    /// Fill the plan for a DeepSeek-V4 drafter with `spec.num_hidden_layers` stages.
    pub(super) fn plan_dsv4(&mut self) {
        let b = self;
        let stages = b.spec.shape.num_hidden_layers;
        let expected = shapes::dsv4_expected(b.spec);
        for exp in &expected {
            match exp.canonical.as_str() {
                shapes::CONFIDENCE_WEIGHT | shapes::CONFIDENCE_BIAS => {}
                _ => {
                    b.require(exp);
                }
            }
        }
        b.confidence(&expected, false);

        // Stages beyond the configured count: one warning per stage, tensors not loaded.
        let mut extra_stages = std::collections::BTreeMap::<usize, usize>::new();
        let mut stage_has_layers = vec![false; stages];
        let leftovers = b.leftovers();
        for key in leftovers {
            let info = b.found[&key];
            let stage = super::names::dsv4_stage(&info.name).map_or(0, |(s, _)| s);
            if stage >= stages {
                *extra_stages.entry(stage).or_default() += 1;
                b.plan.ignored.push(info.name.clone());
                continue;
            }
            if key.starts_with("model.layers.") {
                stage_has_layers[stage] = true;
            }
            b.plan.tensors.insert(key, info.name.clone());
        }
        for (stage, count) in extra_stages {
            b.warn(
                W_UNEXPECTED_TENSOR,
                format!(
                    "{count} tensors under `mtp.{stage}.` but the config has {stages} drafter \
                     stages (n_mtp_layers): they are not loaded"
                ),
            );
        }
        for (stage, has) in stage_has_layers.iter().enumerate() {
            if !has {
                b.problems.push(Error::MissingTensor {
                    tensor: format!("mtp.{stage}.*"),
                    reason: format!("drafter stage {stage} has no decoder-layer tensors"),
                });
            }
        }
    }
}
