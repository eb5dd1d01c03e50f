//! Format detection and normalization of draft configs into [`DraftSpec`].

use std::path::Path;

use serde_json::{Map, Value};

use super::backbone::read_backbone;
use super::fields::{Fields, describe};
use super::formats::read_dspark_keys;
use super::noise::resolve_noise_token_in;
use super::spec::{ConfigFormat, DraftSpec};
use crate::error::{Error, Result};

/// Architectures that mark a DeepSpec-native config.
const DEEPSPEC_ARCHITECTURES: [&str; 2] = ["Qwen3DSparkModel", "Gemma4DSparkModel"];

/// The keys that mark a DeepSeek-V4 in-checkpoint drafter.
const DSV4_KEYS: [&str; 4] = [
    "dspark_block_size",
    "dspark_noise_token_id",
    "dspark_target_layer_ids",
    "dspark_markov_rank",
];

/// Decide which shape a draft config is in.
///
/// Detection order (first match wins, so every config has exactly one reading):
/// 1. a `speculators_model_type` key → [`ConfigFormat::Speculators`] (its value must be
///    `"dspark"`, anything else is `bad-config`);
/// 2. a non-null `dflash_config` → [`ConfigFormat::DFlash`] (it must be an object);
/// 3. `architectures` containing `Qwen3DSparkModel` or `Gemma4DSparkModel`, or a top-level
///    `block_size` together with `target_layer_ids` or `markov_rank` →
///    [`ConfigFormat::DeepSpec`];
/// 4. any of `dspark_block_size`, `dspark_noise_token_id`, `dspark_target_layer_ids`,
///    `dspark_markov_rank` at the top level or in `text_config` →
///    [`ConfigFormat::DeepSeekV4`];
/// 5. otherwise `bad-config`: not a DSpark draft config.
///
/// Step 3 comes before step 4 so a DeepSpec config that also carries copied `dspark_*` keys
/// (as some engines write back) is still read as DeepSpec.
pub fn detect_format(root: &Map<String, Value>, file: &str) -> Result<ConfigFormat> {
    if let Some(v) = root.get("speculators_model_type") {
        return match v.as_str() {
            Some("dspark") => Ok(ConfigFormat::Speculators),
            _ => Err(Error::bad_config(
                file,
                "speculators_model_type",
                format!(
                    "only \"dspark\" speculators are supported, found {}",
                    describe(v)
                ),
            )),
        };
    }
    match root.get("dflash_config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(_)) => return Ok(ConfigFormat::DFlash),
        Some(other) => {
            return Err(Error::bad_config(
                file,
                "dflash_config",
                format!("expected an object, found {}", describe(other)),
            ));
        }
    }
    let architectures = architectures(root, file)?;
    let deepspec_arch = architectures
        .iter()
        .any(|a| DEEPSPEC_ARCHITECTURES.contains(a));
    let has = |key: &str| root.get(key).is_some_and(|v| !v.is_null());
    if deepspec_arch || (has("block_size") && (has("target_layer_ids") || has("markov_rank"))) {
        return Ok(ConfigFormat::DeepSpec);
    }
    if dsv4_root(root).is_some() {
        return Ok(ConfigFormat::DeepSeekV4);
    }
    Err(Error::bad_config(
        file,
        "<root>",
        format!(
            "not a DSpark draft config (architectures {architectures:?}): expected a \
             speculators config (`speculators_model_type: \"dspark\"`), a `dflash_config`, a \
             DeepSpec config (`block_size` with `target_layer_ids`/`markov_rank`) or a \
             DeepSeek-V4 config with `dspark_*` keys"
        ),
    ))
}

/// `architectures` as a list of strings (empty when absent or null).
fn architectures<'a>(root: &'a Map<String, Value>, file: &str) -> Result<Vec<&'a str>> {
    let bad = |v: &Value| {
        Error::bad_config(
            file,
            "architectures",
            format!("expected a list of strings, found {}", describe(v)),
        )
    };
    match root.get("architectures") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v @ Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().ok_or_else(|| bad(v)))
            .collect(),
        Some(v) => Err(bad(v)),
    }
}

/// The object holding a DeepSeek-V4 config's `dspark_*` keys and its dotted prefix: the
/// root, or `text_config` for multimodal (V4.1) checkpoints.
fn dsv4_root(root: &Map<String, Value>) -> Option<(&Map<String, Value>, &'static str)> {
    let has_keys = |m: &Map<String, Value>| DSV4_KEYS.iter().any(|k| m.contains_key(*k));
    if has_keys(root) {
        return Some((root, ""));
    }
    root.get("text_config")
        .and_then(Value::as_object)
        .filter(|t| has_keys(t))
        .map(|t| (t, "text_config."))
}

impl DraftSpec {
    /// Read a draft config from a `config.json` path or a directory holding one.
    pub fn from_path(path: &Path) -> Result<Self> {
        super::json::read_config(path, Self::from_value)
    }

    /// Normalize a parsed draft config in any accepted shape (see [`detect_format`] for how
    /// the shape is chosen). `file` names the source in error messages.
    pub fn from_value(value: &Value, file: &str) -> Result<Self> {
        let root = super::json::root_object(value, file)?;
        let format = detect_format(root, file)?;
        let root_fields = Fields::new(file, root, "");
        let root_model_type = root_fields.string("model_type")?;
        let (dspark, backbone, noise_root, noise_prefix) = match format {
            ConfigFormat::DeepSpec => (root_fields.clone(), root_fields, root, ""),
            ConfigFormat::Speculators => {
                let backbone = match root.get("transformer_layer_config") {
                    None | Some(Value::Null) => root_fields.clone(),
                    Some(Value::Object(tlc)) => {
                        root_fields.clone().then(tlc, "transformer_layer_config.")
                    }
                    Some(other) => {
                        return Err(Error::bad_config(
                            file,
                            "transformer_layer_config",
                            format!("expected an object, found {}", describe(other)),
                        ));
                    }
                };
                (root_fields, backbone, root, "")
            }
            ConfigFormat::DFlash => {
                let dflash = root
                    .get("dflash_config")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        Error::bad_config(file, "dflash_config", "expected an object")
                    })?;
                let dspark = Fields::new(file, dflash, "dflash_config.").then(root, "");
                (dspark, root_fields, root, "")
            }
            ConfigFormat::DeepSeekV4 => {
                let (obj, prefix) = dsv4_root(root)
                    .ok_or_else(|| Error::bad_config(file, "<root>", "no dspark_* keys found"))?;
                let fields = Fields::new(file, obj, prefix);
                (fields.clone(), fields, obj, prefix)
            }
        };
        let text_model_type = backbone.string("model_type")?;
        let dsv4_types: Vec<&str> = root_model_type.into_iter().chain(text_model_type).collect();
        let keys = read_dspark_keys(format, &dspark, &dsv4_types)?;
        let bb = read_backbone(format, &backbone, keys.draft_layers)?;
        let noise_token =
            resolve_noise_token_in(noise_root, noise_prefix, file, bb.shape.vocab_size)?;
        let architecture = architectures(root, file)?
            .first()
            .map_or_else(|| default_architecture(format), |a| (*a).to_string());
        let mut shape = bb.shape;
        if format == ConfigFormat::DeepSeekV4 {
            shape.model_type = root_model_type
                .or(shape.model_type.as_deref())
                .map(str::to_string);
        }
        Ok(DraftSpec {
            source: file.to_string(),
            format,
            architecture,
            block_size: keys.block_size,
            sample_from_anchor: keys.sample_from_anchor,
            noise_token,
            target_layer_ids: keys.layers.target_layer_ids,
            capture_layer_ids: keys.layers.capture_layer_ids,
            num_target_layers: keys.num_target_layers,
            markov_rank: keys.markov_rank,
            markov_head_type: keys.markov_head_type,
            confidence_head: keys.confidence_head,
            confidence_head_with_markov: keys.confidence_head_with_markov,
            shape,
            draft_vocab_size: bb.draft_vocab_size,
            target_hidden_size: bb.target_hidden_size,
            logit_scale: bb.logit_scale,
            final_logit_softcapping: bb.final_logit_softcapping,
            warnings: keys.warnings,
        })
    }
}

/// The architecture name reported when a config has no `architectures`.
fn default_architecture(format: ConfigFormat) -> String {
    match format {
        ConfigFormat::DeepSeekV4 => "DeepseekV4DSpark",
        _ => "DSparkDraftModel",
    }
    .to_string()
}
