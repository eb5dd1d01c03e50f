//! Shape detection, precedence between scopes, and per-format defaults.

use crate::config_common as fx;
use crate::config_common::check::{bad, parse, with, without};
use dspark::ConfigFormat;
use serde_json::json;

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
fn precedence_between_scopes() {
    // Speculators: top-level backbone keys win over transformer_layer_config.
    let s = parse(&with(
        fx::glm52_speculators(),
        &["hidden_size"],
        json!(4096),
    ))
    .unwrap();
    assert_eq!(s.shape.hidden_size, 4096);
    assert_eq!(s.target_hidden_size, 4096);
    let s = parse(&with(
        fx::glm52_speculators(),
        &["target_hidden_size"],
        json!(7168),
    ))
    .unwrap();
    assert_eq!((s.shape.hidden_size, s.target_hidden_size), (6144, 7168));
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
    assert_eq!(s.confidence_input_width(), s.shape.hidden_size);
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
    assert_eq!(s.shape.num_hidden_layers, 3);
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
    assert_eq!(
        (s.shape.rms_norm_eps, s.shape.hidden_act.as_str()),
        (1e-6, "silu")
    );
    let s = parse(&with(fx::qwen3_4b_deepspec(), &["logit_scale"], json!(0.5))).unwrap();
    assert_eq!(s.logit_scale, 0.5);
}
