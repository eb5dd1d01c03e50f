//! Type, range and presence validation of draft configs: every error names file and key.

use crate::config_common as fx;
use crate::config_common::check::{bad, bad_edits, parse, with, without};
use dspark::MarkovHeadType;
use serde_json::{Value, json};

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
    let q = fx::qwen3_4b_deepspec;
    bad_edits([
        (
            q(),
            &["rms_norm_eps"][..],
            json!("1e-6"),
            "rms_norm_eps",
            "finite number",
        ),
        (
            q(),
            &["rms_norm_eps"],
            json!(false),
            "rms_norm_eps",
            "finite number",
        ),
        (
            q(),
            &["hidden_act"],
            json!(1),
            "hidden_act",
            "expected a string",
        ),
        (
            q(),
            &["model_type"],
            json!(3),
            "model_type",
            "expected a string",
        ),
        (
            fx::glm52_speculators(),
            &["transformer_layer_config", "rope_parameters", "rope_theta"],
            json!("8e6"),
            "transformer_layer_config.rope_parameters.rope_theta",
            "finite number",
        ),
        (
            q(),
            &["logit_scale"],
            json!(0.0),
            "logit_scale",
            "greater than 0",
        ),
        (
            q(),
            &["rms_norm_eps"],
            json!(-1e-6),
            "rms_norm_eps",
            "greater than 0",
        ),
    ]);
}

#[test]
fn zero_sizes_are_rejected() {
    for (fixture, key) in [
        (fx::qwen3_4b_deepspec as fn() -> Value, "block_size"),
        (fx::deepseek_v4_flash, "dspark_block_size"),
        (fx::glm52_speculators, "draft_vocab_size"),
        (fx::qwen3_4b_deepspec, "vocab_size"),
        (fx::deepseek_v4_flash, "n_mtp_layers"),
    ] {
        bad(&with(fixture(), &[key], json!(0)), key, "at least 1");
    }
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
    for (fixture, key, shown) in [
        (
            fx::qwen3_4b_deepspec as fn() -> Value,
            "block_size",
            "block_size",
        ),
        (
            fx::qwen3_4b_deepspec,
            "target_layer_ids",
            "target_layer_ids",
        ),
        (fx::qwen3_4b_deepspec, "markov_rank", "markov_rank"),
        (
            fx::glm52_speculators,
            "aux_hidden_state_layer_ids",
            "aux_hidden_state_layer_ids",
        ),
        (fx::glm52_speculators, "markov_rank", "markov_rank"),
        (fx::dflash_nested, "block_size", "dflash_config.block_size"),
        (
            fx::deepseek_v4_flash,
            "dspark_markov_rank",
            "dspark_markov_rank",
        ),
        (
            fx::deepseek_v4_flash,
            "dspark_target_layer_ids",
            "dspark_target_layer_ids",
        ),
    ] {
        bad(&without(fixture(), &[key]), shown, "missing");
    }
    // DSV4 MLP width: moe_intermediate_size, else intermediate_size.
    let no_moe = without(fx::deepseek_v4_flash(), &["moe_intermediate_size"]);
    bad(&no_moe, "intermediate_size", "missing");
    assert_eq!(
        parse(&with(no_moe, &["intermediate_size"], json!(18432)))
            .unwrap()
            .shape
            .intermediate_size,
        18432
    );
}

#[test]
fn markov_rank_and_head_type() {
    let q = fx::qwen3_4b_deepspec;
    bad_edits([
        (
            q(),
            &["markov_rank"][..],
            json!(-256),
            "markov_rank",
            "non-negative",
        ),
        (
            q(),
            &["markov_head_type"],
            json!("lstm"),
            "markov_head_type",
            "\"lstm\"",
        ),
        (
            q(),
            &["markov_head_type"],
            json!(1),
            "markov_head_type",
            "expected a string",
        ),
    ]);
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
fn layer_types() {
    let q = fx::qwen3_4b_deepspec;
    let mixed = json!([
        "full_attention",
        "sliding_attention",
        "full_attention",
        "full_attention",
        "full_attention"
    ]);
    let linear = json!([
        "full_attention",
        "linear_attention",
        "full_attention",
        "full_attention",
        "full_attention"
    ]);
    for (types, needle) in [
        (mixed, "mixes full_attention and sliding_attention"),
        (json!(vec!["sliding_attention"; 5]), "sliding-window"),
        (linear, "entry 1"),
        (json!(vec!["full_attention"; 4]), "4 entries for 5"),
        (json!("full_attention"), "list of strings"),
    ] {
        bad(&with(q(), &["layer_types"], types), "layer_types", needle);
    }
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
    bad_edits([
        (
            q(),
            &["num_key_value_heads"][..],
            json!(5),
            "num_key_value_heads",
            "do not divide",
        ),
        (
            q(),
            &["num_key_value_heads"],
            json!(0),
            "num_key_value_heads",
            "at least 1",
        ),
        (q(), &["head_dim"], json!(0), "head_dim", "at least 1"),
    ]);
    // head_dim falls back to hidden / heads, which must divide.
    let s = parse(&without(q(), &["head_dim"])).unwrap();
    assert_eq!(s.shape.head_dim, 2560 / 32);
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
            .shape
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
