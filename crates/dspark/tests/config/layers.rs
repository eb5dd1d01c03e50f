//! Target layer ids through `DraftSpec`: semantics per format, ranges, and `check_target`.

use crate::config_common as fx;
use crate::config_common::check::{bad, parse, with, without};
use dspark::{DraftSpec, TargetSpec};
use serde_json::{Value, json};

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
