//! Checkpoint-name rules: what a checkpoint tensor name means to the drafter.
//!
//! One pure function, [`classify`], decides for every checkpoint name whether it is loaded
//! (and under which canonical parameter name) or dropped (and why). Names are matched by whole
//! dot-separated segments, never by substring, so `markov_w1` is never mistaken for `w1`.
//!
//! Qwen3-shaped formats (DeepSpec, speculators, dflash): `t2d` is dropped (training only),
//! `d2t` becomes `draft_id_to_target_id`, `mask_embedding` is dropped, `lm_head.*` is kept as
//! is and everything else lives under `model.` (added unless already there).
//!
//! DeepSeek-V4: only `mtp.{stage}.{rest}` names belong to the drafter; the rest are
//! target-owned. Model-level parameters map to `model.{rest}`, everything else to
//! `model.layers.{stage}.{rest}`, where the stacking rules (`w1`/`w3` → `gate_up_proj[0|1]`,
//! `w2` → `down_proj`, `attn.wq_a`/`attn.wkv` → `attn.fused_wqa_wkv[0|1]`, `.scale` suffixes,
//! `ffn.gate.bias` → `ffn.gate.e_score_correction_bias`) apply — to `model.layers.*` only.

use crate::config::ConfigFormat;

/// Drop reason: `t2d` is a training-only target→draft membership mask.
pub const DROP_T2D: &str = "t2d is a training-only target-to-draft mask";
/// Drop reason: `mask_embedding` is a DFlash placeholder DSpark never uses.
pub const DROP_MASK_EMBEDDING: &str = "mask_embedding is unused by DSpark";
/// Drop reason: a DeepSeek-V4 tensor outside `mtp.*`, owned by the target model.
pub const DROP_TARGET_OWNED: &str = "target-owned (outside mtp.*)";

/// The canonical name of the `d2t` table.
pub const D2T_CANONICAL: &str = "draft_id_to_target_id";

/// What to do with one checkpoint tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameRule {
    /// Load it as parameter `canonical`; `shard` is its slot in a stacked parameter
    /// (`gate_up_proj[0]` for `w1`), `None` for a plain parameter.
    Load {
        /// Canonical parameter name.
        canonical: String,
        /// Slot in a stacked parameter, if any.
        shard: Option<usize>,
    },
    /// Do not load it.
    Drop {
        /// Why (one of the `DROP_*` constants).
        reason: &'static str,
    },
}

impl NameRule {
    fn load(canonical: impl Into<String>) -> Self {
        NameRule::Load {
            canonical: canonical.into(),
            shard: None,
        }
    }

    /// The unique key of a loaded tensor: `canonical`, or `canonical[shard]` for a stacked
    /// slot. `None` for a dropped tensor.
    pub fn key(&self) -> Option<String> {
        match self {
            NameRule::Load {
                canonical,
                shard: None,
            } => Some(canonical.clone()),
            NameRule::Load {
                canonical,
                shard: Some(i),
            } => Some(format!("{canonical}[{i}]")),
            NameRule::Drop { .. } => None,
        }
    }
}

/// Classify one checkpoint tensor name under the rules of `format`.
pub fn classify(name: &str, format: ConfigFormat) -> NameRule {
    match format {
        ConfigFormat::DeepSeekV4 => classify_dsv4(name),
        ConfigFormat::DeepSpec | ConfigFormat::Speculators | ConfigFormat::DFlash => {
            classify_qwen3(name)
        }
    }
}

fn classify_qwen3(name: &str) -> NameRule {
    let segments: Vec<&str> = name.split('.').collect();
    if segments.contains(&"t2d") {
        return NameRule::Drop { reason: DROP_T2D };
    }
    if segments.contains(&"mask_embedding") {
        return NameRule::Drop {
            reason: DROP_MASK_EMBEDDING,
        };
    }
    if segments.contains(&"d2t") {
        let renamed: Vec<&str> = segments
            .iter()
            .map(|&s| if s == "d2t" { D2T_CANONICAL } else { s })
            .collect();
        return NameRule::load(renamed.join("."));
    }
    match segments.first() {
        Some(&"lm_head") | Some(&"model") => NameRule::load(name),
        _ => NameRule::load(format!("model.{name}")),
    }
}

/// Model-level parameter prefixes of a DeepSeek-V4 drafter (`mtp.{stage}.{prefix}...`).
pub const DSV4_MODEL_LEVEL: [&str; 8] = [
    "main_proj.",
    "main_norm.",
    "norm.",
    "hc_head_fn",
    "hc_head_base",
    "hc_head_scale",
    "markov_head.",
    "confidence_head.",
];

/// Split `mtp.{stage}.{rest}` into `(stage, rest)`; `None` for any other name.
pub fn dsv4_stage(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("mtp.")?;
    let (stage, rest) = rest.split_once('.')?;
    if stage.is_empty() || !stage.bytes().all(|b| b.is_ascii_digit()) || rest.is_empty() {
        return None;
    }
    Some((stage.parse().ok()?, rest))
}

/// `true` when `rest` (the part after `mtp.{stage}.`) is a model-level parameter.
pub fn dsv4_is_model_level(rest: &str) -> bool {
    DSV4_MODEL_LEVEL.iter().any(|p| rest.starts_with(p))
}

fn classify_dsv4(name: &str) -> NameRule {
    let Some((stage, rest)) = dsv4_stage(name) else {
        return NameRule::Drop {
            reason: DROP_TARGET_OWNED,
        };
    };
    if dsv4_is_model_level(rest) {
        return NameRule::load(format!("model.{rest}"));
    }
    let (rest, shard) = stack_layer_param(rest);
    NameRule::Load {
        canonical: format!("model.layers.{stage}.{rest}"),
        shard,
    }
}

/// The stacking and suffix rules for a decoder-layer parameter (`rest` is relative to
/// `model.layers.{stage}.`). Whole-segment matches only.
fn stack_layer_param(rest: &str) -> (String, Option<usize>) {
    let mut segments: Vec<String> = rest.split('.').map(str::to_string).collect();
    let mut shard = None;
    let routed_expert = segments
        .windows(2)
        .any(|w| w[0] == "experts" && !w[1].is_empty() && w[1].bytes().all(|b| b.is_ascii_digit()));
    for i in 0..segments.len() {
        let prev = if i > 0 { segments[i - 1].as_str() } else { "" };
        let replacement = match (prev, segments[i].as_str()) {
            (_, "w1") => Some(("gate_up_proj", Some(0))),
            (_, "w3") => Some(("gate_up_proj", Some(1))),
            (_, "w2") => Some(("down_proj", None)),
            ("attn", "wq_a") => Some(("fused_wqa_wkv", Some(0))),
            ("attn", "wkv") => Some(("fused_wqa_wkv", Some(1))),
            ("gate", "bias") if i >= 2 && segments[i - 2] == "ffn" => {
                Some(("e_score_correction_bias", None))
            }
            _ => None,
        };
        if let Some((new, s)) = replacement {
            segments[i] = new.to_string();
            shard = shard.or(s);
        }
    }
    let len = segments.len();
    if let Some(last) = segments.last_mut()
        && last == "scale"
        && len > 1
    {
        *last = if routed_expert {
            "weight_scale".to_string()
        } else {
            "weight_scale_inv".to_string()
        };
    }
    (segments.join("."), shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(name: &str, format: ConfigFormat) -> (String, Option<usize>) {
        match classify(name, format) {
            NameRule::Load { canonical, shard } => (canonical, shard),
            NameRule::Drop { reason } => panic!("{name} dropped: {reason}"),
        }
    }

    #[test]
    fn qwen3_rules() {
        let f = ConfigFormat::DeepSpec;
        assert_eq!(load("fc.weight", f).0, "model.fc.weight");
        assert_eq!(load("model.fc.weight", f).0, "model.fc.weight");
        assert_eq!(load("lm_head.weight", f).0, "lm_head.weight");
        assert_eq!(load("d2t", f).0, D2T_CANONICAL);
        assert_eq!(classify("t2d", f), NameRule::Drop { reason: DROP_T2D });
        assert!(matches!(
            classify("mask_embedding", f),
            NameRule::Drop { .. }
        ));
        // Whole segments only: a name merely containing "d2t" is an ordinary parameter.
        assert_eq!(load("xd2t.weight", f).0, "model.xd2t.weight");
    }

    #[test]
    fn dsv4_w_rules_only_under_layers() {
        let f = ConfigFormat::DeepSeekV4;
        assert_eq!(
            load("mtp.2.markov_head.markov_w1.weight", f),
            ("model.markov_head.markov_w1.weight".into(), None)
        );
        assert_eq!(
            load("mtp.1.ffn.experts.7.w1.weight", f),
            (
                "model.layers.1.ffn.experts.7.gate_up_proj.weight".into(),
                Some(0)
            )
        );
        assert_eq!(
            load("mtp.1.ffn.experts.7.w3.scale", f),
            (
                "model.layers.1.ffn.experts.7.gate_up_proj.weight_scale".into(),
                Some(1)
            )
        );
        assert_eq!(
            load("mtp.0.attn.wkv.scale", f),
            (
                "model.layers.0.attn.fused_wqa_wkv.weight_scale_inv".into(),
                Some(1)
            )
        );
        assert_eq!(
            classify("layers.3.attn.wkv.weight", f),
            NameRule::Drop {
                reason: DROP_TARGET_OWNED
            }
        );
        assert_eq!(dsv4_stage("mtp.x.norm.weight"), None);
    }
}
