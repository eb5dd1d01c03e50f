//! Realistic draft/target config fixtures shared by the `config_*` tests.
//!
//! These `json!` values are the source of truth for the JSON files under
//! `tests/fixtures/configs/<name>/config.json` at the repository root (the Python tests read
//! those). `config_shapes::fixture_files_match` fails when they drift apart; regenerate the
//! files with `DSPARK_WRITE_FIXTURES=1 cargo test -p dspark --test config_shapes`.

#![allow(dead_code, clippy::unwrap_used)]

pub mod check;

use std::path::PathBuf;

use serde_json::{Value, json};

/// `tests/fixtures/configs` at the repository root.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/configs")
}

/// Every fixture by directory name.
pub fn all() -> Vec<(&'static str, Value)> {
    vec![
        ("qwen3_4b_deepspec", qwen3_4b_deepspec()),
        ("qwen3_4b_target", qwen3_4b_target()),
        ("gemma4_12b_deepspec", gemma4_12b_deepspec()),
        ("gemma4_12b_target", gemma4_12b_target()),
        ("glm52_speculators", glm52_speculators()),
        ("glm52_target", glm52_target()),
        ("dflash_nested", dflash_nested()),
        ("dflash_nested_target", dflash_nested_target()),
        ("deepseek_v4_flash", deepseek_v4_flash()),
        ("deepseek_v41_flash", deepseek_v41_flash()),
    ]
}

/// `deepseek-ai/dspark_qwen3_4b_block7`: the target Qwen3-4B config with DeepSpec overrides
/// (research notes dspark_reference §2.1).
pub fn qwen3_4b_deepspec() -> Value {
    json!({
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "dtype": "bfloat16",
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2560,
        "initializer_range": 0.02,
        "intermediate_size": 9728,
        "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "sliding_window": null,
        "use_sliding_window": false,
        "tie_word_embeddings": false,
        "use_cache": true,
        "vocab_size": 151936,
        "block_size": 7,
        "mask_token_id": 151669,
        "target_layer_ids": [1, 9, 17, 25, 33],
        "num_target_layers": 36,
        "num_anchors": 512,
        "markov_rank": 256,
        "markov_head_type": "vanilla",
        "enable_confidence_head": true,
        "confidence_head_with_markov": true,
        "confidence_head_alpha": 1.0
    })
}

/// `Qwen/Qwen3-4B`.
pub fn qwen3_4b_target() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": false,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "max_position_embeddings": 40960,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "rope_scaling": null,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936
    })
}

/// `deepseek-ai/dspark_gemma4_12b_block7` (research notes dspark_reference §2.3).
pub fn gemma4_12b_deepspec() -> Value {
    json!({
        "architectures": ["Gemma4DSparkModel"],
        "model_type": "gemma4_text",
        "attention_bias": false,
        "attention_k_eq_v": true,
        "block_size": 7,
        "confidence_head_with_markov": true,
        "enable_confidence_head": true,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 3840,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 15360,
        "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
        "markov_head_type": "vanilla",
        "markov_rank": 256,
        "mask_token_id": 4,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": null,
        "num_anchors": 512,
        "num_attention_heads": 16,
        "num_experts": null,
        "num_global_key_value_heads": 1,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_kv_shared_layers": 0,
        "num_target_layers": 48,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "rope_theta": null,
            "rope_type": "default",
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
        },
        "sliding_window": 1024,
        "target_layer_ids": [5, 17, 29, 41, 46],
        "target_model_type": "gemma4_unified",
        "target_text_model_type": "gemma4_unified_text",
        "tie_word_embeddings": false,
        "transformers_version": "5.10.2",
        "vocab_size": 262144
    })
}

/// `google/gemma-4-12B-it` (multimodal: the language model sits under `text_config`).
pub fn gemma4_12b_target() -> Value {
    json!({
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "model_type": "gemma4_unified",
        "text_config": {
            "model_type": "gemma4_unified_text",
            "final_logit_softcapping": 30.0,
            "global_head_dim": 512,
            "head_dim": 256,
            "hidden_size": 3840,
            "intermediate_size": 15360,
            "num_attention_heads": 16,
            "num_global_key_value_heads": 1,
            "num_hidden_layers": 48,
            "num_key_value_heads": 8,
            "sliding_window": 1024,
            "vocab_size": 262144
        },
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152}
    })
}

/// A RedHatAI GLM-5.2 speculators-format DSpark drafter (research notes §2.4): capture-
/// semantics aux layers, backbone under `transformer_layer_config`, no `sample_from_anchor`.
pub fn glm52_speculators() -> Value {
    json!({
        "architectures": ["DSparkDraftModel"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.5.0",
        "block_size": 8,
        "markov_rank": 256,
        "markov_head_type": "vanilla",
        "enable_confidence_head": true,
        "confidence_head_with_markov": true,
        "draft_vocab_size": 154880,
        "mask_token_id": 154856,
        "max_anchors": 1024,
        "tie_word_embeddings": false,
        "aux_hidden_state_layer_ids": [8, 23, 39, 55, 70],
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 7}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "zai-org/GLM-5.2", "architectures": ["GlmMoeDsaForCausalLM"]}
        },
        "transformer_layer_config": {
            "model_type": "qwen3",
            "num_hidden_layers": 5,
            "hidden_size": 6144,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "head_dim": 64,
            "intermediate_size": 12288,
            "rms_norm_eps": 1e-05,
            "vocab_size": 154880,
            "max_position_embeddings": 202752,
            "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"}
        }
    })
}

/// GLM-5.2 target (the fields a drafter needs).
pub fn glm52_target() -> Value {
    json!({
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": 6144,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "vocab_size": 154880,
        "max_position_embeddings": 202752
    })
}

/// A SpecForge/RadixArk-shaped drafter with DSpark keys under `dflash_config` (research notes
/// §2.4: mask 248077, target layers [4, 16, 28, 40, 52], yarn RoPE).
pub fn dflash_nested() -> Value {
    json!({
        "architectures": ["DSparkDraftModel"],
        "model_type": "qwen3",
        "attention_bias": false,
        "block_size": 7,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "max_position_embeddings": 262144,
        "num_attention_heads": 40,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_target_layers": 64,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000000,
            "factor": 4.0,
            "original_max_position_embeddings": 65536
        },
        "tie_word_embeddings": false,
        "vocab_size": 248320,
        "mask_token_id": null,
        "dflash_config": {
            "mask_token_id": 248077,
            "target_layer_ids": [4, 16, 28, 40, 52],
            "projector_type": "dspark",
            "markov_rank": 256,
            "markov_head_type": "vanilla",
            "enable_confidence_head": true,
            "confidence_head_with_markov": true,
            "use_aux_hidden_state": true,
            "causal": false
        }
    })
}

/// The 64-layer Qwen3-family target of [`dflash_nested`].
pub fn dflash_nested_target() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_attention_heads": 40,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "vocab_size": 248320
    })
}

/// `deepseek-ai/DeepSeek-V4-Flash-DSpark`: the target's own config with `dspark_*` keys; the
/// drafter reads the last target layer (42 of 43).
pub fn deepseek_v4_flash() -> Value {
    json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": 129280,
        "hidden_size": 4096,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 43,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "attention_bias": false,
        "tie_word_embeddings": false,
        "max_position_embeddings": 1048576,
        "rope_theta": 10000,
        "rope_scaling": {
            "type": "yarn",
            "factor": 16,
            "beta_fast": 32,
            "beta_slow": 1,
            "original_max_position_embeddings": 65536
        },
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "sliding_window": 128,
        "index_topk": 512,
        "hc_mult": 4,
        "hc_eps": 1e-06,
        "num_nextn_predict_layers": 1,
        "n_mtp_layers": 3,
        "dspark_block_size": 5,
        "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [40, 41, 42],
        "dspark_markov_rank": 256
    })
}

/// DeepSeek-V4.1-Flash: multimodal, the language model and its `dspark_*` keys under
/// `text_config`; `dspark_target_layer_ids` are capture ids (attention inputs of 37–39).
pub fn deepseek_v41_flash() -> Value {
    json!({
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "image_token_id": 129264,
        "text_config": {
            "model_type": "deepseek_v41_text",
            "vocab_size": 129280,
            "hidden_size": 5120,
            "moe_intermediate_size": 2304,
            "num_hidden_layers": 40,
            "num_attention_heads": 64,
            "num_key_value_heads": 1,
            "head_dim": 512,
            "qk_rope_head_dim": 64,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-06,
            "attention_bias": false,
            "tie_word_embeddings": false,
            "max_position_embeddings": 1048576,
            "rope_theta": 10000,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 16,
                "beta_fast": 32,
                "beta_slow": 1,
                "original_max_position_embeddings": 65536
            },
            "n_routed_experts": 384,
            "num_experts_per_tok": 6,
            "sliding_window": 128,
            "hc_mult": 4,
            "num_nextn_predict_layers": 3,
            "dspark_block_size": 5,
            "dspark_noise_token_id": 128799,
            "dspark_target_layer_ids": [37, 38, 39],
            "dspark_markov_rank": 256,
            "dspark_n_routed_experts": 128,
            "dspark_num_experts_per_tok": 3
        },
        "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 32, "hidden_size": 1024}
    })
}
