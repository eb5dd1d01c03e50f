//! DeepSeek-V4 in-checkpoint drafters: the `mtp.*` remap and the load plan.
use crate::checkpoint_common::*;
use dspark::checkpoint::names::{DROP_TARGET_OWNED, NameRule, classify};
use dspark::checkpoint::plan::{W_CONFIDENCE_HEAD_DISABLED, W_UNEXPECTED_TENSOR};
use dspark::{ConfigFormat, DraftSpec, LoadPlan, WeightSource};

const V: usize = 64;
const STAGES: usize = 3;

fn key(name: &str) -> Option<String> {
    classify(name, ConfigFormat::DeepSeekV4).key()
}

#[test]
fn markov_w1_is_not_the_expert_w1() {
    // Model-level: kept 1:1 under `model.`; the `w1` stacking rule must not fire.
    assert_eq!(
        key("mtp.2.markov_head.markov_w1.weight").as_deref(),
        Some("model.markov_head.markov_w1.weight")
    );
    assert_eq!(
        key("mtp.2.markov_head.markov_w2.weight").as_deref(),
        Some("model.markov_head.markov_w2.weight")
    );
    // Even a literal `w1` segment under a model-level prefix is left alone ...
    assert_eq!(
        key("mtp.2.markov_head.w1.weight").as_deref(),
        Some("model.markov_head.w1.weight")
    );
    // ... while decoder-layer `w1`/`w3`/`w2` are stacked.
    assert_eq!(
        key("mtp.0.ffn.experts.5.w1.weight").as_deref(),
        Some("model.layers.0.ffn.experts.5.gate_up_proj.weight[0]")
    );
    assert_eq!(
        key("mtp.0.ffn.experts.5.w3.weight").as_deref(),
        Some("model.layers.0.ffn.experts.5.gate_up_proj.weight[1]")
    );
    assert_eq!(
        key("mtp.0.ffn.shared_experts.w2.weight").as_deref(),
        Some("model.layers.0.ffn.shared_experts.down_proj.weight")
    );
    assert_eq!(
        key("mtp.1.ffn.shared_experts.w1.scale").as_deref(),
        Some("model.layers.1.ffn.shared_experts.gate_up_proj.weight_scale_inv[0]")
    );
    assert_eq!(
        key("mtp.1.ffn.experts.0.w2.scale").as_deref(),
        Some("model.layers.1.ffn.experts.0.down_proj.weight_scale")
    );
    assert_eq!(
        key("mtp.1.attn.wq_a.weight").as_deref(),
        Some("model.layers.1.attn.fused_wqa_wkv.weight[0]")
    );
    assert_eq!(
        key("mtp.1.ffn.gate.bias").as_deref(),
        Some("model.layers.1.ffn.gate.e_score_correction_bias")
    );
    assert_eq!(
        key("mtp.0.main_proj.weight").as_deref(),
        Some("model.main_proj.weight")
    );
    assert_eq!(key("mtp.2.hc_head_fn").as_deref(), Some("model.hc_head_fn"));
}

#[test]
fn target_owned_names_are_dropped() {
    for name in [
        "embed.weight",
        "layers.3.ffn.experts.0.w1.weight",
        "mtp",
        "mtp.x.norm.weight",
        "head.weight",
    ] {
        assert_eq!(
            classify(name, ConfigFormat::DeepSeekV4),
            NameRule::Drop {
                reason: DROP_TARGET_OWNED
            },
            "{name}"
        );
    }
}

fn dsv4_tensors(stages: usize) -> Vec<T> {
    let last = stages - 1;
    let mut t = vec![
        bf16("embed.weight", &[V, H]),
        bf16("head.weight", &[V, H]),
        bf16("layers.0.attn.wkv.weight", &[H, H]),
        bf16("mtp.0.main_proj.weight", &[H, TARGET_LAYERS * H]),
        bf16("mtp.0.main_norm.weight", &[H]),
        bf16(&format!("mtp.{last}.norm.weight"), &[H]),
        bf16(&format!("mtp.{last}.hc_head_fn"), &[4, 4 * H]),
        bf16(
            &format!("mtp.{last}.markov_head.markov_w1.weight"),
            &[V, RANK],
        ),
        bf16(
            &format!("mtp.{last}.markov_head.markov_w2.weight"),
            &[V, RANK],
        ),
        bf16(
            &format!("mtp.{last}.confidence_head.proj.weight"),
            &[1, H + RANK],
        ),
    ];
    for s in 0..stages {
        for n in [
            "attn.wq_a.weight",
            "attn.wkv.weight",
            "ffn.experts.0.w1.weight",
            "ffn.experts.0.w3.weight",
            "ffn.experts.0.w2.weight",
        ] {
            t.push(bf16(&format!("mtp.{s}.{n}"), &[2, 2]));
        }
    }
    t
}

fn plan(spec: &DraftSpec, tensors: &[T]) -> dspark::Result<LoadPlan> {
    crate::checkpoint_common::plan(spec, V, tensors)
}

#[test]
fn complete_dsv4_drafter() {
    let spec = dsv4_spec(V, STAGES);
    let p = plan(&spec, &dsv4_tensors(STAGES)).unwrap();
    assert_eq!(
        (p.embed_tokens, p.lm_head),
        (WeightSource::SharedTarget, WeightSource::SharedTarget)
    );
    assert!(p.id_map.is_identity());
    assert!(p.confidence_head);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(p.target_owned, 3);
    assert!(p.ignored.is_empty());
    assert_eq!(
        p.tensors["model.markov_head.markov_w1.weight"],
        "mtp.2.markov_head.markov_w1.weight"
    );
    assert_eq!(
        p.tensors["model.layers.1.ffn.experts.0.gate_up_proj.weight[0]"],
        "mtp.1.ffn.experts.0.w1.weight"
    );
    assert_eq!(
        p.tensors["model.layers.1.ffn.experts.0.gate_up_proj.weight[1]"],
        "mtp.1.ffn.experts.0.w3.weight"
    );
    assert_eq!(p.tensors["model.hc_head_fn"], "mtp.2.hc_head_fn");
    assert_eq!(p.tensors.len(), 7 + 5 * STAGES);
}

#[test]
fn dsv4_problems_are_all_reported() {
    let spec = dsv4_spec(V, STAGES);
    let mut t: Vec<T> = dsv4_tensors(STAGES)
        .into_iter()
        .filter(|t| !t.name.starts_with("mtp.1.") && t.name != "mtp.2.markov_head.markov_w2.weight")
        .collect();
    t = reshape(t, "mtp.0.main_proj.weight", &[H, H]);
    let e = plan(&spec, &t).unwrap_err();
    assert_eq!(
        codes(&e),
        ["missing-tensor", "missing-tensor", "shape-mismatch"]
    );
    let text = e.to_string();
    assert!(text.contains("`mtp.1.*`"), "{text}");
    assert!(
        text.contains("`mtp.2.markov_head.markov_w2.weight`"),
        "{text}"
    );
    assert!(text.contains("`mtp.0.main_proj.weight`"), "{text}");
}

#[test]
fn dsv4_confidence_and_extra_stages() {
    let spec = dsv4_spec(V, STAGES);
    let mut t = without(dsv4_tensors(STAGES), &["mtp.2.confidence_head.proj.weight"]);
    t.push(bf16("mtp.3.attn.wkv.weight", &[2, 2]));
    t.push(bf16("mtp.3.attn.wq_a.weight", &[2, 2]));
    let p = plan(&spec, &t).unwrap();
    assert!(!p.confidence_head);
    let mut w = warning_codes(&p);
    w.sort();
    assert_eq!(w, [W_CONFIDENCE_HEAD_DISABLED, W_UNEXPECTED_TENSOR]);
    assert_eq!(p.ignored.len(), 2);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.message.contains("2 tensors under `mtp.3.`"))
    );
    // The DSV4 head may carry a bias; with Markov rank r its width is H + r.
    let mut t = dsv4_tensors(STAGES);
    t.push(bf16("mtp.2.confidence_head.proj.bias", &[1]));
    let p = plan(&spec, &t).unwrap();
    assert!(p.tensors.contains_key("model.confidence_head.proj.bias"));
    let t = reshape(
        dsv4_tensors(STAGES),
        "mtp.2.confidence_head.proj.weight",
        &[1, H],
    );
    assert_eq!(codes(&plan(&spec, &t).unwrap_err()), ["shape-mismatch"]);
}

#[test]
fn dsv4_many_target_names_are_counted_not_listed() {
    let spec = dsv4_spec(V, STAGES);
    let mut t = dsv4_tensors(STAGES);
    for l in 1..41 {
        for n in [
            "attn.wkv.weight",
            "ffn.experts.0.w1.weight",
            "attn_norm.weight",
        ] {
            t.push(bf16(&format!("layers.{l}.{n}"), &[2]));
        }
    }
    let p = plan(&spec, &t).unwrap();
    assert_eq!(p.target_owned, 3 + 120);
    assert!(p.ignored.is_empty());
}
