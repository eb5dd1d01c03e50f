//! The DSpark-specific keys of each config shape (block, layers, Markov and confidence heads).

use super::fields::Fields;
use super::layers::{LayerIdSemantics, TargetLayers, resolve_target_layers};
use super::spec::{ConfigFormat, MarkovHeadType};
use crate::error::Result;
use crate::error::Warning;
use crate::limits::{MAX_BLOCK, MAX_LAYERS};

/// The DSpark keys of a draft config, normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct DsparkKeys {
    /// Trained block width.
    pub block_size: usize,
    /// Slot layout.
    pub sample_from_anchor: bool,
    /// Target layers in both semantics.
    pub layers: TargetLayers,
    /// Number of target layers, when the config says.
    pub num_target_layers: Option<usize>,
    /// Markov rank (0 = DFlash).
    pub markov_rank: usize,
    /// Markov head variant.
    pub markov_head_type: MarkovHeadType,
    /// `enable_confidence_head`.
    pub confidence_head: bool,
    /// `confidence_head_with_markov`.
    pub confidence_head_with_markov: bool,
    /// Draft layer count when it is not the backbone's `num_hidden_layers` (DeepSeek-V4).
    pub draft_layers: Option<usize>,
    /// Non-fatal notes.
    pub warnings: Vec<Warning>,
}

/// Read the DSpark keys of a `format`-shaped config from `f` (in priority order: for
/// `dflash_config` configs, `dflash_config` first, then the top level).
///
/// `dsv4_model_types` are the `model_type`s of a DeepSeek-V4 config (root and `text_config`),
/// which decide the semantics of `dspark_target_layer_ids`.
pub fn read_dspark_keys(
    format: ConfigFormat,
    f: &Fields<'_>,
    dsv4_model_types: &[&str],
) -> Result<DsparkKeys> {
    let mut warnings = Vec::new();
    let (block_key, layers_key, rank_key, head_key) = match format {
        ConfigFormat::DeepSeekV4 => (
            "dspark_block_size",
            "dspark_target_layer_ids",
            "dspark_markov_rank",
            "dspark_markov_head_type",
        ),
        ConfigFormat::Speculators => (
            "block_size",
            "aux_hidden_state_layer_ids",
            "markov_rank",
            "markov_head_type",
        ),
        ConfigFormat::DeepSpec | ConfigFormat::DFlash => (
            "block_size",
            "target_layer_ids",
            "markov_rank",
            "markov_head_type",
        ),
    };
    let block_size = f.required_at_most(block_key, "the trained block width", MAX_BLOCK)?;

    let (num_target_layers, draft_layers) = match format {
        ConfigFormat::DeepSeekV4 => (
            Some(f.required_at_most("num_hidden_layers", "the target layer count", MAX_LAYERS)?),
            Some(f.positive_at_most("n_mtp_layers", MAX_LAYERS)?.unwrap_or(3)),
        ),
        _ => (f.positive_at_most("num_target_layers", MAX_LAYERS)?, None),
    };

    let (semantics, forbid_final) = match format {
        ConfigFormat::DeepSpec | ConfigFormat::DFlash => (LayerIdSemantics::OutputOf, true),
        ConfigFormat::Speculators => (LayerIdSemantics::InputOf, false),
        ConfigFormat::DeepSeekV4 => {
            let (semantics, warning) = dsv4_semantics(dsv4_model_types);
            warnings.extend(warning);
            (semantics, false)
        }
    };
    let (value, key) = f.raw(layers_key).ok_or_else(|| {
        f.bad(
            &f.name_of(layers_key),
            "missing (required: which target layers feed the drafter)",
        )
    })?;
    let layers = resolve_target_layers(
        value,
        semantics,
        num_target_layers,
        forbid_final,
        f.file(),
        &key,
    )?;

    let plain_dflash = format == ConfigFormat::DFlash && !is_dspark_projector(f)?;
    let markov_rank = match (f.uint(rank_key)?, plain_dflash) {
        (Some(r), _) => f.at_most(rank_key, r, MAX_BLOCK)?,
        (None, true) => 0,
        (None, false) => {
            return Err(f.bad(
                &f.name_of(rank_key),
                "missing (required: the Markov head rank; 0 means a DFlash drafter)",
            ));
        }
    };
    let markov_head_type = match f.string(head_key)? {
        None | Some("vanilla") => MarkovHeadType::Vanilla,
        Some("gated") => MarkovHeadType::Gated,
        Some("rnn") => MarkovHeadType::Rnn,
        Some(other) => {
            return Err(f.bad(
                &f.name_of(head_key),
                format!("unknown Markov head type {other:?} (expected vanilla, gated or rnn)"),
            ));
        }
    };
    // DeepSeek-V4 ships a confidence head reading [h ; W1[x]]; DeepSpec defaults both off.
    let confidence_default = format == ConfigFormat::DeepSeekV4;
    let confidence_head = f
        .boolean("enable_confidence_head")?
        .unwrap_or(confidence_default);
    let confidence_head_with_markov = f
        .boolean("confidence_head_with_markov")?
        .unwrap_or(confidence_default);

    let sample_from_anchor = match (f.boolean("sample_from_anchor")?, format) {
        (Some(s), _) => s,
        (None, ConfigFormat::Speculators) => {
            warnings.push(Warning::new(
                "sample-from-anchor-assumed",
                format!(
                    "{}: speculators config without `sample_from_anchor`: assumed false (the \
                     1+K layout of older speculators checkpoints, slot 0 predicts the anchor's \
                     successor only after the anchor itself); set it explicitly if this \
                     checkpoint was trained with the DeepSpec layout",
                    f.file()
                ),
            ));
            false
        }
        (None, _) => true,
    };
    Ok(DsparkKeys {
        block_size,
        sample_from_anchor,
        layers,
        num_target_layers,
        markov_rank,
        markov_head_type,
        confidence_head,
        confidence_head_with_markov,
        draft_layers,
        warnings,
    })
}

/// `projector_type`, when present, must be a string; `"dspark"` makes `markov_rank` required.
fn is_dspark_projector(f: &Fields<'_>) -> Result<bool> {
    Ok(f.string("projector_type")? == Some("dspark"))
}

/// Semantics of `dspark_target_layer_ids`: output-of ids for `deepseek_v4`, capture ids as-is
/// for `deepseek_v41` (V4.1 reads the attention inputs of its target layers). An unknown
/// `model_type` is read as `deepseek_v4`, with a warning.
fn dsv4_semantics(model_types: &[&str]) -> (LayerIdSemantics, Option<Warning>) {
    if model_types.iter().any(|t| t.starts_with("deepseek_v41")) {
        return (LayerIdSemantics::InputOf, None);
    }
    if model_types.iter().any(|t| t.starts_with("deepseek_v4")) {
        return (LayerIdSemantics::OutputOf, None);
    }
    (
        LayerIdSemantics::OutputOf,
        Some(Warning::new(
            "layer-semantics-assumed",
            format!(
                "model_type {model_types:?} is neither deepseek_v4 nor deepseek_v41: \
                 dspark_target_layer_ids read as outputs of layers (deepseek_v4 semantics)"
            ),
        )),
    )
}
