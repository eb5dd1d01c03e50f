//! Every validation error of draft config normalization, and the defaults and precedence
//! rules that decide what is valid.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod config_common;

use config_common as fx;
use dspark::{ConfigFormat, DraftSpec, Error, MarkovHeadType, TargetSpec};
use serde_json::{Value, json};

const FILE: &str = "drafts/x/config.json";

fn parse(v: &Value) -> Result<DraftSpec, Error> {
    DraftSpec::from_value(v, FILE)
}

/// Assert `v` fails with `bad-config` naming `key` (dotted), the file, and `needle`.
#[track_caller]
fn bad(v: &Value, key: &str, needle: &str) {
    let e = parse(v).expect_err("config must be rejected");
    let msg = e.to_string();
    assert_eq!(e.code(), "bad-config", "{msg}");
    match &e {
        Error::BadConfig { file, key: k, .. } => {
            assert_eq!(file, FILE);
            assert_eq!(k, key, "{msg}");
        }
        other => panic!("expected BadConfig, got {other:?}"),
    }
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

fn with(mut v: Value, path: &[&str], new: Value) -> Value {
    let (last, parents) = path.split_last().unwrap();
    let mut cur = &mut v;
    for p in parents {
        cur = &mut cur[*p];
    }
    cur[*last] = new;
    v
}

fn without(mut v: Value, path: &[&str]) -> Value {
    let (last, parents) = path.split_last().unwrap();
    let mut cur = &mut v;
    for p in parents {
        cur = &mut cur[*p];
    }
    cur.as_object_mut().unwrap().remove(*last);
    v
}

#[test]
fn unrecognized_shapes() {
    bad(&json!([1, 2]), "<root>", "JSON object");
    bad(
        &json!({"model_type": "qwen3", "hidden_size": 8}),
        "<root>",
        "not a DSpark draft config",
    );
    // block_size alone is not enough to call a config DeepSpec.
    bad(
        &json!({"block_size": 7}),
        "<root>",
        "not a DSpark draft config",
    );
    bad(
        &json!({"speculators_model_type": "eagle3"}),
        "speculators_model_type",
        "\"eagle3\"",
    );
    bad(
        &json!({"speculators_model_type": true}),
        "speculators_model_type",
        "boolean",
    );
    bad(
        &json!({"dflash_config": "x"}),
        "dflash_config",
        "expected an object",
    );
    bad(
        &json!({"architectures": "Qwen3DSparkModel"}),
        "architectures",
        "list of strings",
    );
    bad(
        &with(
            fx::glm52_speculators(),
            &["transformer_layer_config"],
            json!(5),
        ),
        "transformer_layer_config",
        "object",
    );
}

#[test]
fn detection_order() {
    // Structure alone (no architectures) is DeepSpec, reported under a generic name.
    let s = parse(&without(fx::qwen3_4b_deepspec(), &["architectures"])).unwrap();
    assert_eq!(
        (s.format, s.architecture.as_str()),
        (ConfigFormat::DeepSpec, "DSparkDraftModel")
    );
    // A DeepSpec config carrying copied dspark_* keys stays DeepSpec.
    let s = parse(&with(
        fx::gemma4_12b_deepspec(),
        &["dspark_target_layer_ids"],
        json!([5, 17]),
    ))
    .unwrap();
    assert_eq!(s.format, ConfigFormat::DeepSpec);
    assert_eq!(s.target_layer_ids, [5, 17, 29, 41, 46]);
    // dflash_config beats DeepSpec structure; speculators beats dflash_config.
    let mut both = fx::qwen3_4b_deepspec();
    both["dflash_config"] = json!({"target_layer_ids": [2, 4]});
    assert_eq!(parse(&both).unwrap().format, ConfigFormat::DFlash);
    let mut spec = fx::glm52_speculators();
    spec["dflash_config"] = json!({"target_layer_ids": [2, 4]});
    assert_eq!(parse(&spec).unwrap().format, ConfigFormat::Speculators);
    // A DSV4 config without architectures gets the DSV4 name.
    let s = parse(&without(fx::deepseek_v4_flash(), &["architectures"])).unwrap();
    assert_eq!(s.architecture, "DeepseekV4DSpark");
}

#[test]
fn broken_types_everywhere() {
    let cases: [(Value, &[&str], &str); 9] = [
        (fx::qwen3_4b_deepspec(), &["block_size"], "block_size"),
        (fx::qwen3_4b_deepspec(), &["hidden_size"], "hidden_size"),
        (fx::qwen3_4b_deepspec(), &["markov_rank"], "markov_rank"),
        (
            fx::qwen3_4b_deepspec(),
            &["num_target_layers"],
            "num_target_layers",
        ),
        (
            fx::glm52_speculators(),
            &["transformer_layer_config", "num_attention_heads"],
            "transformer_layer_config.num_attention_heads",
        ),
        (
            fx::glm52_speculators(),
            &["draft_vocab_size"],
            "draft_vocab_size",
        ),
        (
            fx::dflash_nested(),
            &["dflash_config", "markov_rank"],
            "dflash_config.markov_rank",
        ),
        (
            fx::deepseek_v4_flash(),
            &["dspark_block_size"],
            "dspark_block_size",
        ),
        (
            fx::deepseek_v41_flash(),
            &["text_config", "dspark_markov_rank"],
            "text_config.dspark_markov_rank",
        ),
    ];
    for (base, path, key) in cases {
        for broken in [
            json!(true),
            json!("7"),
            json!(7.0),
            json!(7.5),
            json!(-1),
            json!([7]),
        ] {
            bad(
                &with(base.clone(), path, broken.clone()),
                key,
                "expected a non-negative integer",
            );
        }
    }
    for (key, broken) in [
        ("enable_confidence_head", json!("true")),
        ("confidence_head_with_markov", json!(1)),
        ("sample_from_anchor", json!(0)),
        ("attention_bias", json!("no")),
        ("tie_word_embeddings", json!(null)),
    ] {
        if broken.is_null() {
            continue; // null is absent: default applies
        }
        bad(
            &with(fx::qwen3_4b_deepspec(), &[key], broken),
            key,
            "expected a boolean",
        );
    }
    bad(
        &with(fx::qwen3_4b_deepspec(), &["rms_norm_eps"], json!("1e-6")),
        "rms_norm_eps",
        "finite number",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["rms_norm_eps"], json!(false)),
        "rms_norm_eps",
        "finite number",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["hidden_act"], json!(1)),
        "hidden_act",
        "expected a string",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["model_type"], json!(3)),
        "model_type",
        "expected a string",
    );
    bad(
        &with(
            fx::glm52_speculators(),
            &["transformer_layer_config", "rope_parameters", "rope_theta"],
            json!("8e6"),
        ),
        "transformer_layer_config.rope_parameters.rope_theta",
        "finite number",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["logit_scale"], json!(0.0)),
        "logit_scale",
        "greater than 0",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["rms_norm_eps"], json!(-1e-6)),
        "rms_norm_eps",
        "greater than 0",
    );
}

#[test]
fn zero_sizes_are_rejected() {
    bad(
        &with(fx::qwen3_4b_deepspec(), &["block_size"], json!(0)),
        "block_size",
        "at least 1",
    );
    bad(
        &with(fx::deepseek_v4_flash(), &["dspark_block_size"], json!(0)),
        "dspark_block_size",
        "at least 1",
    );
    bad(
        &with(fx::glm52_speculators(), &["draft_vocab_size"], json!(0)),
        "draft_vocab_size",
        "at least 1",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["vocab_size"], json!(0)),
        "vocab_size",
        "at least 1",
    );
    bad(
        &with(fx::deepseek_v4_flash(), &["n_mtp_layers"], json!(0)),
        "n_mtp_layers",
        "at least 1",
    );
}

#[test]
fn missing_required_keys() {
    for key in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "intermediate_size",
    ] {
        bad(&without(fx::qwen3_4b_deepspec(), &[key]), key, "missing");
        bad(&without(fx::dflash_nested(), &[key]), key, "missing");
        // Speculators: the backbone key is reported under the scope it is looked up in first.
        bad(
            &without(fx::glm52_speculators(), &["transformer_layer_config", key]),
            key,
            "missing",
        );
    }
    for key in ["hidden_size", "num_hidden_layers", "num_attention_heads"] {
        bad(
            &without(fx::deepseek_v41_flash(), &["text_config", key]),
            &format!("text_config.{key}"),
            "missing",
        );
    }
    bad(
        &without(fx::qwen3_4b_deepspec(), &["block_size"]),
        "block_size",
        "missing",
    );
    bad(
        &without(fx::qwen3_4b_deepspec(), &["target_layer_ids"]),
        "target_layer_ids",
        "missing",
    );
    bad(
        &without(fx::qwen3_4b_deepspec(), &["markov_rank"]),
        "markov_rank",
        "missing",
    );
    bad(
        &without(fx::glm52_speculators(), &["aux_hidden_state_layer_ids"]),
        "aux_hidden_state_layer_ids",
        "missing",
    );
    bad(
        &without(fx::glm52_speculators(), &["markov_rank"]),
        "markov_rank",
        "missing",
    );
    bad(
        &without(fx::dflash_nested(), &["block_size"]),
        "dflash_config.block_size",
        "missing",
    );
    bad(
        &without(fx::deepseek_v4_flash(), &["dspark_markov_rank"]),
        "dspark_markov_rank",
        "missing",
    );
    bad(
        &without(fx::deepseek_v4_flash(), &["dspark_target_layer_ids"]),
        "dspark_target_layer_ids",
        "missing",
    );
    // DSV4 MLP width: moe_intermediate_size, else intermediate_size.
    let no_moe = without(fx::deepseek_v4_flash(), &["moe_intermediate_size"]);
    bad(&no_moe, "intermediate_size", "missing");
    assert_eq!(
        parse(&with(no_moe, &["intermediate_size"], json!(18432)))
            .unwrap()
            .intermediate_size,
        18432
    );
}

#[test]
fn markov_rank_and_head_type() {
    bad(
        &with(fx::qwen3_4b_deepspec(), &["markov_rank"], json!(-256)),
        "markov_rank",
        "non-negative",
    );
    bad(
        &with(
            fx::qwen3_4b_deepspec(),
            &["markov_head_type"],
            json!("lstm"),
        ),
        "markov_head_type",
        "\"lstm\"",
    );
    bad(
        &with(fx::qwen3_4b_deepspec(), &["markov_head_type"], json!(1)),
        "markov_head_type",
        "expected a string",
    );
    for (name, ty) in [
        ("gated", MarkovHeadType::Gated),
        ("rnn", MarkovHeadType::Rnn),
        ("vanilla", MarkovHeadType::Vanilla),
    ] {
        let s = parse(&with(
            fx::qwen3_4b_deepspec(),
            &["markov_head_type"],
            json!(name),
        ))
        .unwrap();
        assert_eq!(s.markov_head_type, ty);
        assert_eq!(ty.as_str(), name);
    }
    // Absent head type: vanilla. markov_rank 0: a DFlash drafter.
    let s = parse(&with(
        without(fx::qwen3_4b_deepspec(), &["markov_head_type"]),
        &["markov_rank"],
        json!(0),
    ))
    .unwrap();
    assert_eq!(s.markov_head_type, MarkovHeadType::Vanilla);
    assert!(s.is_dflash());
    // dflash_config: markov_rank optional (0) unless the projector is dspark.
    let plain = without(
        without(fx::dflash_nested(), &["dflash_config", "markov_rank"]),
        &["dflash_config", "projector_type"],
    );
    assert_eq!(parse(&plain).unwrap().markov_rank, 0);
    bad(
        &without(fx::dflash_nested(), &["dflash_config", "markov_rank"]),
        "dflash_config.markov_rank",
        "missing",
    );
    bad(
        &with(
            fx::dflash_nested(),
            &["dflash_config", "projector_type"],
            json!(3),
        ),
        "dflash_config.projector_type",
        "string",
    );
}

#[test]
fn layer_ids() {
    let q = fx::qwen3_4b_deepspec;
    bad(
        &with(q(), &["target_layer_ids"], json!([1, 9, 9, 25])),
        "target_layer_ids",
        "strictly increasing",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!([9, 1])),
        "target_layer_ids",
        "strictly increasing",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!([])),
        "target_layer_ids",
        "at least one",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!([1, true])),
        "target_layer_ids",
        "integer",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!([1, 2.0])),
        "target_layer_ids",
        "integer",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!([-2, 1])),
        "target_layer_ids",
        "below -1",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!("1,9")),
        "target_layer_ids",
        "list of layer ids",
    );
    // num_target_layers = 36: id 36 does not exist, 35 is the forbidden final layer.
    bad(
        &with(q(), &["target_layer_ids"], json!([1, 36])),
        "target_layer_ids",
        "does not exist",
    );
    bad(
        &with(q(), &["target_layer_ids"], json!([1, 35])),
        "target_layer_ids",
        "final layer",
    );
    let s = parse(&with(q(), &["target_layer_ids"], json!([-1, 34]))).unwrap();
    assert_eq!(s.capture_layer_ids, [0, 35]);
    // dflash_config ids are DeepSpec semantics too.
    bad(
        &with(
            fx::dflash_nested(),
            &["dflash_config", "target_layer_ids"],
            json!([4, 63]),
        ),
        "dflash_config.target_layer_ids",
        "final layer",
    );
    // DeepSeek-V4 legitimately reads its last layer, but not beyond.
    bad(
        &with(
            fx::deepseek_v4_flash(),
            &["dspark_target_layer_ids"],
            json!([41, 43]),
        ),
        "dspark_target_layer_ids",
        "does not exist",
    );
    // Speculators: capture ids start at 0 (the embeddings).
    bad(
        &with(
            fx::glm52_speculators(),
            &["aux_hidden_state_layer_ids"],
            json!([-1, 3]),
        ),
        "aux_hidden_state_layer_ids",
        "below 0",
    );
    let s = parse(&with(
        fx::glm52_speculators(),
        &["aux_hidden_state_layer_ids"],
        json!([0, 3]),
    ))
    .unwrap();
    assert_eq!(s.target_layer_ids, [-1, 2]);
}

#[test]
fn layer_types() {
    let q = fx::qwen3_4b_deepspec;
    let mixed = json!([
        "full_attention",
        "sliding_attention",
        "full_attention",
        "full_attention",
        "full_attention"
    ]);
    bad(
        &with(q(), &["layer_types"], mixed),
        "layer_types",
        "mixes full_attention and sliding_attention",
    );
    bad(
        &with(q(), &["layer_types"], json!(vec!["sliding_attention"; 5])),
        "layer_types",
        "sliding-window",
    );
    bad(
        &with(
            q(),
            &["layer_types"],
            json!([
                "full_attention",
                "linear_attention",
                "full_attention",
                "full_attention",
                "full_attention"
            ]),
        ),
        "layer_types",
        "entry 1",
    );
    bad(
        &with(q(), &["layer_types"], json!(vec!["full_attention"; 4])),
        "layer_types",
        "4 entries for 5",
    );
    bad(
        &with(q(), &["layer_types"], json!("full_attention")),
        "layer_types",
        "list of strings",
    );
    // DeepSeek-V4: layer_types would describe the target, not the drafter: not checked.
    let dsv4 = with(
        fx::deepseek_v4_flash(),
        &["layer_types"],
        json!(["sliding_attention", "full_attention"]),
    );
    assert!(parse(&dsv4).is_ok());
}

#[test]
fn heads() {
    let q = fx::qwen3_4b_deepspec;
    bad(
        &with(q(), &["num_key_value_heads"], json!(5)),
        "num_key_value_heads",
        "do not divide",
    );
    bad(
        &with(q(), &["num_key_value_heads"], json!(0)),
        "num_key_value_heads",
        "at least 1",
    );
    bad(
        &with(q(), &["head_dim"], json!(0)),
        "head_dim",
        "at least 1",
    );
    // head_dim falls back to hidden / heads, which must divide.
    let s = parse(&without(q(), &["head_dim"])).unwrap();
    assert_eq!(s.head_dim, 2560 / 32);
    bad(
        &with(
            without(q(), &["head_dim"]),
            &["num_attention_heads"],
            json!(24),
        ),
        "num_attention_heads",
        "do not divide hidden_size",
    );
    // Absent kv heads: one per attention head.
    assert_eq!(
        parse(&without(q(), &["num_key_value_heads"]))
            .unwrap()
            .num_key_value_heads,
        32
    );
    // Gemma4 global kv heads must divide too.
    bad(
        &with(
            fx::gemma4_12b_deepspec(),
            &["num_global_key_value_heads"],
            json!(3),
        ),
        "num_global_key_value_heads",
        "do not divide",
    );
}

#[test]
fn precedence_between_scopes() {
    // Speculators: top-level backbone keys win over transformer_layer_config.
    let s = parse(&with(
        fx::glm52_speculators(),
        &["hidden_size"],
        json!(4096),
    ))
    .unwrap();
    assert_eq!(s.hidden_size, 4096);
    assert_eq!(s.target_hidden_size, 4096);
    let s = parse(&with(
        fx::glm52_speculators(),
        &["target_hidden_size"],
        json!(7168),
    ))
    .unwrap();
    assert_eq!((s.hidden_size, s.target_hidden_size), (6144, 7168));
    assert_eq!(s.context_width(), 5 * 7168);
    // dflash_config wins over the top level for DSpark keys.
    let d = with(fx::dflash_nested(), &["target_layer_ids"], json!([1, 2]));
    let d = with(d, &["markov_rank"], json!(64));
    let d = with(d, &["dflash_config", "block_size"], json!(4));
    let s = parse(&d).unwrap();
    assert_eq!(s.target_layer_ids, [4, 16, 28, 40, 52]);
    assert_eq!((s.markov_rank, s.block_size), (256, 4));
    // ... and the top level fills what dflash_config lacks.
    let s = parse(&without(
        fx::dflash_nested(),
        &["dflash_config", "target_layer_ids"],
    ))
    .unwrap_err();
    assert!(
        s.to_string().contains("`dflash_config.target_layer_ids`"),
        "{s}"
    );
    let d = with(
        without(fx::dflash_nested(), &["dflash_config", "target_layer_ids"]),
        &["target_layer_ids"],
        json!([3, 7]),
    );
    assert_eq!(parse(&d).unwrap().target_layer_ids, [3, 7]);
}

#[test]
fn defaults_per_format() {
    // DeepSpec: confidence off, anchor layout on, no warning.
    let bare = without(
        without(
            without(fx::qwen3_4b_deepspec(), &["enable_confidence_head"]),
            &["confidence_head_with_markov"],
        ),
        &["num_target_layers"],
    );
    let s = parse(&bare).unwrap();
    assert!(!s.confidence_head && !s.confidence_head_with_markov && s.sample_from_anchor);
    assert_eq!(s.num_target_layers, None);
    assert_eq!(s.confidence_input_width(), s.hidden_size);
    let s = parse(&with(
        fx::qwen3_4b_deepspec(),
        &["sample_from_anchor"],
        json!(false),
    ))
    .unwrap();
    assert!(!s.sample_from_anchor && s.warnings.is_empty());
    // Speculators with an explicit sample_from_anchor: honored, no warning.
    let s = parse(&with(
        fx::glm52_speculators(),
        &["sample_from_anchor"],
        json!(true),
    ))
    .unwrap();
    assert!(s.sample_from_anchor && s.warnings.is_empty());
    // DSV4: n_mtp_layers defaults to 3; confidence defaults can be overridden.
    let s = parse(&without(fx::deepseek_v4_flash(), &["n_mtp_layers"])).unwrap();
    assert_eq!(s.num_hidden_layers, 3);
    let s = parse(&with(
        fx::deepseek_v4_flash(),
        &["enable_confidence_head"],
        json!(false),
    ))
    .unwrap();
    assert!(!s.confidence_head && s.confidence_head_with_markov);
    // Defaults of the backbone extras.
    let s = parse(&without(
        without(fx::qwen3_4b_deepspec(), &["rms_norm_eps"]),
        &["hidden_act"],
    ))
    .unwrap();
    assert_eq!((s.rms_norm_eps, s.hidden_act.as_str()), (1e-6, "silu"));
    let s = parse(&with(fx::qwen3_4b_deepspec(), &["logit_scale"], json!(0.5))).unwrap();
    assert_eq!(s.logit_scale, 0.5);
}

#[test]
fn dsv4_layer_semantics_by_model_type() {
    // Flat V4.1 config: capture ids as-is.
    let flat41 = with(
        fx::deepseek_v4_flash(),
        &["model_type"],
        json!("deepseek_v41"),
    );
    let flat41 = with(flat41, &["dspark_target_layer_ids"], json!([37, 38, 39]));
    let s = parse(&flat41).unwrap();
    assert_eq!(
        (s.capture_layer_ids.clone(), s.target_layer_ids.clone()),
        (vec![37, 38, 39], vec![36, 37, 38])
    );
    // V4.1 capture id 43 = output of the last of 43 layers: fine; 44 is not.
    let s = parse(&with(
        flat41.clone(),
        &["dspark_target_layer_ids"],
        json!([41, 42, 43]),
    ))
    .unwrap();
    assert_eq!(s.target_layer_ids, [40, 41, 42]);
    bad(
        &with(flat41, &["dspark_target_layer_ids"], json!([42, 44])),
        "dspark_target_layer_ids",
        "does not exist",
    );
    // Unknown model_type: read as deepseek_v4, with a warning.
    let s = parse(&with(
        fx::deepseek_v4_flash(),
        &["model_type"],
        json!("mystery"),
    ))
    .unwrap();
    assert_eq!(s.target_layer_ids, [40, 41, 42]);
    assert_eq!(s.warnings.len(), 1);
    assert_eq!(s.warnings[0].code, "layer-semantics-assumed");
}

fn target(v: Value) -> TargetSpec {
    TargetSpec::from_value(&v, "target/config.json").unwrap()
}

fn mismatches(s: &DraftSpec, t: &TargetSpec) -> Vec<String> {
    s.check_target(t)
        .into_iter()
        .map(|e| {
            assert_eq!(e.code(), "target-mismatch");
            e.to_string()
        })
        .collect()
}

#[test]
fn check_target_reports_every_mismatch() {
    let s = parse(&fx::qwen3_4b_deepspec()).unwrap();
    // Qwen3-8B-like target: 36 layers but hidden 4096.
    let wrong_hidden =
        target(json!({"vocab_size": 151936, "num_hidden_layers": 36, "hidden_size": 4096}));
    let m = mismatches(&s, &wrong_hidden);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].contains("2560") && m[0].contains("4096") && m[0].contains("target/config.json"));
    // 34 layers: id 33 is then the final layer, and num_target_layers disagrees.
    let short = target(json!({"vocab_size": 151936, "num_hidden_layers": 34, "hidden_size": 2560}));
    let m = mismatches(&s, &short);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m[0].contains("final layer"), "{m:?}");
    assert!(
        m[1].contains("num_target_layers") && m[1].contains("34"),
        "{m:?}"
    );
    // 30 layers, everything wrong at once.
    let tiny = target(json!({"vocab_size": 10, "num_hidden_layers": 30, "hidden_size": 8}));
    let m = mismatches(&s, &tiny);
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(m[0].contains("does not exist"), "{m:?}");
    // Without num_target_layers only the layer range speaks.
    let s = parse(&without(fx::qwen3_4b_deepspec(), &["num_target_layers"])).unwrap();
    assert_eq!(mismatches(&s, &short).len(), 1);
    // Capture-semantics and DSV4 drafters may read the last layer.
    let spec = parse(&fx::glm52_speculators()).unwrap();
    let t70 = target(json!({"vocab_size": 154880, "num_hidden_layers": 70, "hidden_size": 6144}));
    assert!(
        mismatches(&spec, &t70).is_empty(),
        "capture 70 = output of layer 69 of 70"
    );
    let t69 = target(json!({"vocab_size": 154880, "num_hidden_layers": 69, "hidden_size": 6144}));
    assert_eq!(mismatches(&spec, &t69).len(), 1);
    let v4 = parse(&fx::deepseek_v4_flash()).unwrap();
    let t42 = target(json!({"vocab_size": 129280, "num_hidden_layers": 42, "hidden_size": 4096}));
    let m = mismatches(&v4, &t42);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m[0].contains("does not exist"), "{m:?}");
}
