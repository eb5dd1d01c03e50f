//! Each accepted draft config shape, normalized from a realistic fixture, and checked against
//! its target.

use std::path::Path;

use dspark::ConfigFormat::{self, DeepSeekV4, DeepSpec, Speculators};
use dspark::config::spec::RopeSpec;
use dspark::{DraftSpec, MarkovHeadType, NoiseTokenSource, TargetSpec};
use serde_json::Value;

fn spec(v: &Value) -> DraftSpec {
    DraftSpec::from_value(v, "config.json").unwrap()
}

/// Assert `s` finds nothing wrong with the target config `t`.
#[track_caller]
fn assert_fits(s: &DraftSpec, t: &Value) {
    let target = TargetSpec::from_value(t, "target.json").unwrap();
    assert!(s.check_target(&target).is_empty());
}

/// Assert the format, architecture and model type `s` was read as.
#[track_caller]
fn assert_kind(s: &DraftSpec, format: ConfigFormat, architecture: &str, model_type: &str) {
    assert_eq!(s.format, format);
    assert_eq!(s.architecture, architecture);
    assert_eq!(s.shape.model_type.as_deref(), Some(model_type));
}

/// `(num_attention_heads, num_key_value_heads, head_dim)` of `s`.
fn heads(s: &DraftSpec) -> (usize, usize, usize) {
    let h = &s.shape;
    (h.num_attention_heads, h.num_key_value_heads, h.head_dim)
}

/// The noise token's id and where it came from.
fn noise(s: &DraftSpec) -> (u32, NoiseTokenSource) {
    (s.noise_token.id, s.noise_token.source)
}

#[test]
fn fixture_files_match() {
    let dir = crate::config_common::fixtures_dir();
    let write = std::env::var_os("DSPARK_WRITE_FIXTURES").is_some();
    for (name, value) in crate::config_common::all() {
        let path = dir.join(name).join("config.json");
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text = serde_json::to_string_pretty(&value).unwrap() + "\n";
            std::fs::write(&path, text).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (regenerate with DSPARK_WRITE_FIXTURES=1)",
                path.display()
            )
        });
        let on_disk: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(on_disk, value, "{name}: fixture file out of date");
    }
}

#[test]
fn qwen3_4b_deepspec() {
    let s = spec(&crate::config_common::qwen3_4b_deepspec());
    assert_kind(&s, DeepSpec, "Qwen3DSparkModel", "qwen3");
    assert_eq!(s.block_size, 7);
    assert!(s.sample_from_anchor);
    assert_eq!(noise(&s), (151669, NoiseTokenSource::MaskTokenId));
    assert_eq!(s.target_layer_ids, [1, 9, 17, 25, 33]);
    assert_eq!(s.capture_layer_ids, [2, 10, 18, 26, 34]);
    assert_eq!(s.num_target_layers, Some(36));
    assert_eq!(
        (s.markov_rank, s.markov_head_type),
        (256, MarkovHeadType::Vanilla)
    );
    assert!(s.confidence_head && s.confidence_head_with_markov);
    assert_eq!(s.confidence_input_width(), 2560 + 256);
    assert_eq!((s.shape.vocab_size, s.draft_vocab_size), (151936, 151936));
    assert_eq!((s.shape.hidden_size, s.target_hidden_size), (2560, 2560));
    assert_eq!(s.context_width(), 5 * 2560);
    assert_eq!(s.shape.num_hidden_layers, 5);
    assert_eq!(heads(&s), (32, 8, 128));
    assert_eq!(s.shape.intermediate_size, 9728);
    assert_eq!(s.shape.rms_norm_eps, 1e-6);
    assert_eq!(s.shape.rope, RopeSpec::neox(1e6));
    assert_eq!(s.shape.max_position_embeddings, Some(40960));
    assert_eq!(s.logit_scale, 1.0);
    assert_eq!(s.final_logit_softcapping, None);
    assert_eq!(s.shape.hidden_act, "silu");
    assert!(!s.shape.attention_bias && !s.shape.tie_word_embeddings);
    assert!(s.warnings.is_empty());
    assert_fits(&s, &crate::config_common::qwen3_4b_target());
}

#[test]
fn gemma4_12b_deepspec() {
    let s = spec(&crate::config_common::gemma4_12b_deepspec());
    assert_kind(&s, DeepSpec, "Gemma4DSparkModel", "gemma4_text");
    assert_eq!(noise(&s), (4, NoiseTokenSource::MaskTokenId));
    assert_eq!(s.target_layer_ids, [5, 17, 29, 41, 46]);
    assert_eq!(s.capture_layer_ids, [6, 18, 30, 42, 47]);
    assert_eq!(s.num_target_layers, Some(48));
    // Draft layers are full-attention layers: the global head shape applies.
    assert_eq!(heads(&s), (16, 1, 512));
    assert_eq!(s.shape.rope.theta, 1e6);
    assert_eq!(s.shape.rope.partial_rotary_factor, 0.25);
    assert_eq!(s.shape.rope.rope_type, "proportional");
    assert_eq!(s.final_logit_softcapping, Some(30.0));
    assert_eq!(s.shape.hidden_act, "gelu_pytorch_tanh");
    assert_eq!(
        (
            s.shape.vocab_size,
            s.shape.hidden_size,
            s.shape.intermediate_size
        ),
        (262144, 3840, 15360)
    );
    assert!(s.confidence_head && s.confidence_head_with_markov);
    assert_fits(&s, &crate::config_common::gemma4_12b_target());
}

#[test]
fn glm52_speculators() {
    let s = spec(&crate::config_common::glm52_speculators());
    assert_kind(&s, Speculators, "DSparkDraftModel", "qwen3");
    assert_eq!(s.block_size, 8);
    // Absent sample_from_anchor: the speculators default (1+K layout), loudly.
    assert!(!s.sample_from_anchor);
    assert_eq!(s.warnings.len(), 1);
    assert_eq!(s.warnings[0].code, "sample-from-anchor-assumed");
    assert!(s.warnings[0].message.contains("sample_from_anchor"));
    assert_eq!(noise(&s), (154856, NoiseTokenSource::MaskTokenId));
    // aux ids are capture semantics: DeepSpec ids are one less.
    assert_eq!(s.capture_layer_ids, [8, 23, 39, 55, 70]);
    assert_eq!(s.target_layer_ids, [7, 22, 38, 54, 69]);
    assert_eq!(s.num_target_layers, None);
    assert_eq!((s.shape.vocab_size, s.draft_vocab_size), (154880, 154880));
    assert_eq!((s.shape.hidden_size, s.shape.num_hidden_layers), (6144, 5));
    assert_eq!(heads(&s), (64, 64, 64));
    assert_eq!(
        (s.shape.intermediate_size, s.shape.rms_norm_eps),
        (12288, 1e-5)
    );
    assert_eq!(s.shape.rope.theta, 8e6);
    assert_eq!(s.shape.max_position_embeddings, Some(202752));
    assert_fits(&s, &crate::config_common::glm52_target());
}

#[test]
fn dflash_nested() {
    let s = spec(&crate::config_common::dflash_nested());
    assert_eq!(s.format, ConfigFormat::DFlash);
    assert_eq!(s.architecture, "DSparkDraftModel");
    assert_eq!(
        noise(&s),
        (248077, NoiseTokenSource::DflashConfigMaskTokenId)
    );
    assert_eq!(s.target_layer_ids, [4, 16, 28, 40, 52]);
    assert_eq!(s.capture_layer_ids, [5, 17, 29, 41, 53]);
    assert_eq!(s.num_target_layers, Some(64));
    assert_eq!(s.block_size, 7);
    assert!(s.sample_from_anchor);
    assert_eq!(s.markov_rank, 256);
    assert!(s.confidence_head && s.confidence_head_with_markov);
    assert_eq!(s.shape.rope.rope_type, "yarn");
    assert_eq!(s.shape.rope.theta, 1e7);
    assert_eq!(s.shape.rope.factor, Some(4.0));
    assert_eq!(s.shape.rope.original_max_position_embeddings, Some(65536));
    assert_eq!(heads(&s), (40, 8, 128));
    assert_fits(&s, &crate::config_common::dflash_nested_target());
}

#[test]
fn deepseek_v4_flash() {
    let cfg = crate::config_common::deepseek_v4_flash();
    let s = spec(&cfg);
    assert_kind(&s, DeepSeekV4, "DeepseekV4ForCausalLM", "deepseek_v4");
    assert_eq!(s.block_size, 5);
    assert!(s.sample_from_anchor);
    assert_eq!(noise(&s), (128799, NoiseTokenSource::DsparkNoiseTokenId));
    // deepseek_v4: output-of-layer ids; the last target layer is legitimately read.
    assert_eq!(s.target_layer_ids, [40, 41, 42]);
    assert_eq!(s.capture_layer_ids, [41, 42, 43]);
    assert_eq!(s.num_target_layers, Some(43));
    assert_eq!(s.shape.num_hidden_layers, 3);
    assert_eq!(s.markov_rank, 256);
    assert!(s.confidence_head && s.confidence_head_with_markov);
    assert_eq!((s.shape.vocab_size, s.draft_vocab_size), (129280, 129280));
    assert_eq!((s.shape.hidden_size, s.target_hidden_size), (4096, 4096));
    assert_eq!(s.context_width(), 3 * 4096);
    assert_eq!(heads(&s), (64, 1, 512));
    assert_eq!(s.shape.intermediate_size, 2048);
    assert_eq!(s.shape.rope.rope_type, "yarn");
    assert_eq!(
        (
            s.shape.rope.factor,
            s.shape.rope.original_max_position_embeddings
        ),
        (Some(16.0), Some(65536))
    );
    assert!(s.warnings.is_empty());
    // The drafter's target is the same checkpoint.
    assert_fits(&s, &cfg);
}

#[test]
fn deepseek_v41_flash() {
    let cfg = crate::config_common::deepseek_v41_flash();
    let s = spec(&cfg);
    assert_kind(&s, DeepSeekV4, "DeepseekV41ForCausalLM", "deepseek_v41");
    // deepseek_v41: the ids are capture ids as-is.
    assert_eq!(s.capture_layer_ids, [37, 38, 39]);
    assert_eq!(s.target_layer_ids, [36, 37, 38]);
    assert_eq!(s.num_target_layers, Some(40));
    assert_eq!(s.shape.num_hidden_layers, 3);
    assert_eq!(
        (s.shape.hidden_size, s.shape.intermediate_size),
        (5120, 2304)
    );
    assert_eq!(s.noise_token.id, 128799);
    assert_fits(&s, &cfg);
}

#[test]
fn from_path_reads_fixture_directories() {
    let dir = crate::config_common::fixtures_dir();
    for name in [
        "qwen3_4b_deepspec",
        "glm52_speculators",
        "deepseek_v4_flash",
    ] {
        let s = DraftSpec::from_path(&dir.join(name)).unwrap();
        assert!(s.source.ends_with("config.json"), "{}", s.source);
    }
    let e = DraftSpec::from_path(Path::new("/nonexistent/dspark")).unwrap_err();
    assert_eq!(e.code(), "missing-file");
}

#[test]
fn json_roundtrip_is_stable() {
    // A normalized spec serializes (inspect --json) with stable names.
    let s = spec(&crate::config_common::glm52_speculators());
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["format"], "speculators");
    assert_eq!(v["noise_token"]["source"], "mask_token_id");
    assert_eq!(v["warnings"][0]["code"], "sample-from-anchor-assumed");
}
