//! Load plans for Qwen3-shaped drafters: vocabulary rules (the seed cases), sharing, shapes,
//! the id map, the confidence head and the name rules.
use crate::checkpoint_common::*;
use dspark::checkpoint::plan::{
    W_CONFIDENCE_HEAD_DISABLED, W_CONFIDENCE_HEAD_IGNORED, W_PADDED_SHARED_LM_HEAD,
    W_UNEXPECTED_TENSOR,
};
use dspark::{DraftSpec, LoadPlan, VocabLayout, WeightSource};

/// The plan of `spec` over its full Qwen3 checkpoint less the tensors `names`.
fn plan_without(spec: &DraftSpec, v_t: usize, names: &[&str]) -> dspark::Result<LoadPlan> {
    plan(spec, v_t, &without(qwen3_tensors(spec), names))
}

fn err(spec: &DraftSpec, v_t: usize, tensors: &[T]) -> dspark::Error {
    plan(spec, v_t, tensors).unwrap_err()
}

#[test]
fn complete_full_vocab_drafter() {
    let spec = qwen3_spec(100, 100);
    let p = plan(&spec, 100, &qwen3_tensors(&spec)).unwrap();
    assert_eq!(p.vocab.layout(), VocabLayout::Full);
    assert_eq!(
        (p.embed_tokens, p.lm_head),
        (WeightSource::Own, WeightSource::Own)
    );
    assert!(p.id_map.is_identity());
    assert!(p.confidence_head);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(p.tensors.len(), 9 + 11 * LAYERS);
    assert_eq!(p.tensors["model.fc.weight"], "fc.weight");
    assert_eq!(p.tensors["lm_head.weight"], "lm_head.weight");
    assert_eq!(
        p.tensors["model.layers.1.mlp.down_proj.weight"],
        "layers.1.mlp.down_proj.weight"
    );
}

#[test]
fn full_vocab_shares_embed_and_lm_head() {
    let spec = qwen3_spec(100, 100);
    let p = plan_without(&spec, 100, &["embed_tokens.weight", "lm_head.weight"]).unwrap();
    assert_eq!(
        (p.embed_tokens, p.lm_head),
        (WeightSource::SharedTarget, WeightSource::SharedTarget)
    );
    assert!(p.warnings.is_empty());
    assert!(!p.tensors.contains_key("lm_head.weight"));
}

#[test]
fn padded_drafter_loads_with_identity() {
    // The seed bug: V_d > V_t is padded, not reduced — no d2t, no lm_head needed.
    let spec = qwen3_spec(100, 128);
    let p = plan_without(&spec, 100, &["lm_head.weight", "embed_tokens.weight"]).unwrap();
    assert_eq!(p.vocab.layout(), VocabLayout::Padded);
    assert!(p.id_map.is_identity());
    assert_eq!(p.id_map.to_target(99), Some(99));
    assert_eq!(p.id_map.to_target(100), None, "padded ids never map");
    assert_eq!(p.lm_head, WeightSource::SharedTarget);
    assert_eq!(warning_codes(&p), [W_PADDED_SHARED_LM_HEAD]);
    // With its own lm_head: no warning.
    let p = plan_without(&spec, 100, &["embed_tokens.weight"]).unwrap();
    assert_eq!(p.lm_head, WeightSource::Own);
    assert!(p.warnings.is_empty());
}

#[test]
fn padded_drafter_with_zero_d2t_is_identity() {
    let spec = qwen3_spec(128, 128);
    let mut tensors = qwen3_tensors(&spec);
    tensors.push(i64s("d2t", &[0; 128]));
    let p = plan(&spec, 100, &tensors).unwrap();
    assert!(p.id_map.is_identity());
    assert!(p.ignored.contains(&"d2t".to_string()));
}

#[test]
fn inkling_small_real_sizes_header_only() {
    // Inkling-Small: V_t 200058, embed/unembed [201024, 4096], draft_vocab_size 201024.
    let mut spec = qwen3_spec(201_024, 201_024);
    spec.shape.hidden_size = 4096;
    spec.target_hidden_size = 4096;
    let tensors = qwen3_tensors(&spec); // written sparse: ~3.3 GB logical, no disk
    let p = plan(&spec, 200_058, &tensors).unwrap();
    assert_eq!(p.vocab.layout(), VocabLayout::Padded);
    assert_eq!(p.vocab.padded_rows(), 966);
    assert!(p.id_map.is_identity());
    assert_eq!(
        (p.embed_tokens, p.lm_head),
        (WeightSource::Own, WeightSource::Own)
    );
    // V_in > V_t: the embedding cannot be shared.
    let e = err(&spec, 200_058, &without(tensors, &["embed_tokens.weight"]));
    assert_eq!(codes(&e), ["missing-embed-tokens"]);
}

fn reduced_tensors(spec: &DraftSpec) -> Vec<T> {
    // Draft ids 0..40 map to target ids 0, 2, 4, ... (offset d).
    let offsets: Vec<i64> = (0..spec.draft_vocab_size as i64).collect();
    let mut t = qwen3_tensors(spec);
    t.push(i64s("d2t", &offsets));
    t.push(bf16("t2d", &[100]));
    t
}

#[test]
fn reduced_drafter_uses_its_d2t() {
    let spec = qwen3_spec(100, 40);
    let p = plan(&spec, 100, &reduced_tensors(&spec)).unwrap();
    assert_eq!(p.vocab.layout(), VocabLayout::Reduced);
    assert!(!p.id_map.is_identity());
    assert_eq!(p.id_map.to_target(7), Some(14));
    assert_eq!(p.id_map.to_target(39), Some(78));
    assert_eq!(p.tensors["draft_id_to_target_id"], "d2t");
    assert_eq!(p.ignored, ["t2d"]);
}

#[test]
fn reduced_drafter_needs_lm_head_and_d2t() {
    let spec = qwen3_spec(100, 40);
    let missing = |names: &[&str]| err(&spec, 100, &without(reduced_tensors(&spec), names));
    assert_eq!(codes(&missing(&["lm_head.weight"])), ["missing-lm-head"]);
    assert_eq!(codes(&missing(&["d2t"])), ["missing-d2t"]);
    let e = missing(&["d2t", "lm_head.weight"]);
    assert_eq!(e.code(), "multiple");
    assert_eq!(codes(&e), ["missing-d2t", "missing-lm-head"]);
}

#[test]
fn expanded_input_needs_embed_tokens() {
    let spec = qwen3_spec(120, 100);
    let e = plan_without(&spec, 100, &["embed_tokens.weight"]).unwrap_err();
    assert_eq!(codes(&e), ["missing-embed-tokens"]);
    let p = plan(&spec, 100, &qwen3_tensors(&spec)).unwrap();
    assert_eq!(p.embed_tokens, WeightSource::Own);
}

#[test]
fn d2t_errors_propagate() {
    let spec = qwen3_spec(100, 4);
    let with = |d2t: T| {
        let mut t = qwen3_tensors(&spec);
        t.push(d2t);
        t
    };
    assert_eq!(
        codes(&err(&spec, 100, &with(i64s("d2t", &[0, 0, 0])))),
        ["d2t-wrong-length"]
    );
    assert_eq!(
        codes(&err(&spec, 100, &with(i64s("d2t", &[0, 0, 0, 97])))),
        ["d2t-out-of-range"]
    );
    assert_eq!(
        codes(&err(&spec, 100, &with(i64s("d2t", &[1, 0, 0, 0])))),
        ["d2t-duplicate"]
    );
    assert_eq!(
        codes(&err(&spec, 100, &with(bf16("d2t", &[4])))),
        ["bad-dtype"]
    );
    assert_eq!(
        codes(&err(&spec, 100, &with(bf16("d2t", &[2, 2])))),
        ["shape-mismatch"]
    );
}

#[test]
fn shape_mismatches_and_missing_tensors_are_all_reported() {
    let spec = qwen3_spec(100, 100);
    let mut tensors = qwen3_tensors(&spec);
    tensors = reshape(tensors, "fc.weight", &[H, 2 * H]);
    tensors = reshape(
        tensors,
        "layers.1.self_attn.k_proj.weight",
        &[HEADS * HD, H],
    );
    tensors = reshape(tensors, "lm_head.weight", &[99, H]);
    tensors = without(tensors, &["norm.weight", "layers.0.mlp.up_proj.weight"]);
    let e = err(&spec, 100, &tensors);
    assert_eq!(
        codes(&e),
        [
            "missing-tensor",
            "missing-tensor",
            "shape-mismatch",
            "shape-mismatch",
            "shape-mismatch"
        ]
    );
    let text = e.to_string();
    for name in [
        "`fc.weight`",
        "`layers.1.self_attn.k_proj.weight`",
        "`lm_head.weight`",
        "`norm.weight`",
        "`layers.0.mlp.up_proj.weight`",
    ] {
        assert!(text.contains(name), "{name} not in {text}");
    }
    let mismatch = e
        .problems()
        .into_iter()
        .find(|p| p.to_string().contains("fc.weight"))
        .unwrap();
    assert!(
        matches!(mismatch, dspark::Error::ShapeMismatch { expected, found, .. }
        if *expected == [H, TARGET_LAYERS * H] && *found == [H, 2 * H])
    );
}

#[test]
fn confidence_head_rules() {
    let spec = qwen3_spec(100, 100);
    let conf = ["confidence_head.proj.weight", "confidence_head.proj.bias"];
    // Enabled, absent: off, loudly.
    let p = plan_without(&spec, 100, &conf).unwrap();
    assert!(!p.confidence_head);
    assert_eq!(warning_codes(&p), [W_CONFIDENCE_HEAD_DISABLED]);
    // Disabled, present: ignored with a warning.
    let off = DraftSpec {
        confidence_head: false,
        ..spec.clone()
    };
    let p = plan(&off, 100, &qwen3_tensors(&spec)).unwrap();
    assert!(!p.confidence_head);
    assert_eq!(warning_codes(&p), [W_CONFIDENCE_HEAD_IGNORED]);
    assert!(
        p.ignored
            .contains(&"confidence_head.proj.weight".to_string())
    );
    // Enabled, weight without bias.
    let e = plan_without(&spec, 100, &["confidence_head.proj.bias"]).unwrap_err();
    assert_eq!(codes(&e), ["missing-tensor"]);
    // Without Markov conditioning the head reads H inputs, not H + r.
    let plain = DraftSpec {
        confidence_head_with_markov: false,
        ..spec.clone()
    };
    let e = err(&plain, 100, &qwen3_tensors(&spec));
    assert_eq!(codes(&e), ["shape-mismatch"]);
    let t = reshape(qwen3_tensors(&spec), "confidence_head.proj.weight", &[1, H]);
    assert!(plan(&plain, 100, &t).unwrap().confidence_head);
}

#[test]
fn ignored_and_unexpected_names() {
    let spec = qwen3_spec(100, 100);
    let mut tensors = qwen3_tensors(&spec);
    tensors.push(bf16("mask_embedding", &[H]));
    tensors.push(bf16("t2d", &[100]));
    tensors.push(bf16("layers.2.mlp.up_proj.weight", &[INTER, H]));
    tensors.push(bf16("extra_head.weight", &[2]));
    let p = plan(&spec, 100, &tensors).unwrap();
    let mut ignored = p.ignored.clone();
    ignored.sort();
    assert_eq!(
        ignored,
        [
            "extra_head.weight",
            "layers.2.mlp.up_proj.weight",
            "mask_embedding",
            "t2d"
        ]
    );
    assert_eq!(
        warning_codes(&p),
        [W_UNEXPECTED_TENSOR, W_UNEXPECTED_TENSOR]
    );
    assert!(!p.tensors.values().any(|n| n == "extra_head.weight"));
}

#[test]
fn prefixed_names_and_collisions() {
    let spec = qwen3_spec(100, 100);
    let prefixed: Vec<T> = qwen3_tensors(&spec)
        .into_iter()
        .map(|mut t| {
            if !t.name.starts_with("lm_head") {
                t.name = format!("model.{}", t.name);
            }
            t
        })
        .collect();
    let p = plan(&spec, 100, &prefixed).unwrap();
    assert_eq!(p.tensors["model.fc.weight"], "model.fc.weight");
    let mut both = qwen3_tensors(&spec);
    both.push(bf16("model.fc.weight", &[H, TARGET_LAYERS * H]));
    let e = err(&spec, 100, &both);
    assert_eq!(codes(&e), ["bad-safetensors"]);
    assert!(e.to_string().contains("model.fc.weight"));
}

#[test]
fn attention_bias_and_dflash_rank_zero() {
    let mut spec = qwen3_spec(100, 100);
    spec.shape.attention_bias = true;
    let e = err(&spec, 100, &qwen3_tensors(&spec));
    assert_eq!(codes(&e), vec!["missing-tensor"; 4 * LAYERS]);
    assert!(e.to_string().contains("layers.0.self_attn.o_proj.bias"));
    // markov_rank 0 (DFlash): no Markov head required; one shipped is unexpected.
    let dflash = DraftSpec {
        markov_rank: 0,
        confidence_head: false,
        ..qwen3_spec(100, 100)
    };
    let tensors = without(
        qwen3_tensors(&qwen3_spec(100, 100)),
        &[
            "confidence_head.proj.weight",
            "confidence_head.proj.bias",
            "markov_head.markov_w2.weight",
        ],
    );
    let p = plan(&dflash, 100, &tensors).unwrap();
    assert_eq!(warning_codes(&p), [W_UNEXPECTED_TENSOR]);
    assert_eq!(p.ignored, ["markov_head.markov_w1.weight"]);
}
