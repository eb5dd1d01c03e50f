//! The noise (mask) token chain: one function, used everywhere.
//!
//! Lookup order, first hit wins (the vLLM model-runner-v2 order):
//!
//! 1. `dflash_config.mask_token_id` — when the key is present in `dflash_config`;
//! 2. `mask_token_id` — when present **and not null** (HF configs often carry
//!    `"mask_token_id": null`);
//! 3. `dspark_noise_token_id` (DeepSeek-V4);
//! 4. `pard_token`;
//! 5. `ptd_token_id`.
//!
//! Steps 1 and 3–5 are presence-aware: a present key whose value is `null`, a boolean, a
//! float, a string, ... is a `bad-config` error naming the key (it never falls through to the
//! next key). An integer outside `[0, V_in)`, negative ones included, is
//! [`Error::NoiseTokenOutOfRange`]. No key at all is [`Error::NoNoiseToken`].

use serde_json::{Map, Value};

use super::fields::describe;
use super::spec::{NoiseToken, NoiseTokenSource};
use crate::error::{Error, Result};

/// Resolve the noise token of a draft config whose root object is `root`.
///
/// `file` names the config in errors; `input_vocab` is `V_in` (the draft `vocab_size`).
pub fn resolve_noise_token(
    root: &Map<String, Value>,
    file: &str,
    input_vocab: usize,
) -> Result<NoiseToken> {
    resolve_noise_token_in(root, "", file, input_vocab)
}

/// [`resolve_noise_token`] for a root nested in a bigger file (e.g. a DeepSeek-V4.1
/// `text_config`): error keys are reported as `{prefix}{key}`.
pub fn resolve_noise_token_in(
    root: &Map<String, Value>,
    prefix: &str,
    file: &str,
    input_vocab: usize,
) -> Result<NoiseToken> {
    let dflash = match root.get("dflash_config") {
        None | Some(Value::Null) => None,
        Some(Value::Object(d)) => Some(d),
        Some(other) => {
            return Err(Error::bad_config(
                file,
                format!("{prefix}dflash_config"),
                format!("expected an object, found {}", describe(other)),
            ));
        }
    };
    for source in NoiseTokenSource::ORDER {
        let found = match source {
            NoiseTokenSource::DflashConfigMaskTokenId => {
                dflash.and_then(|d| d.get("mask_token_id"))
            }
            NoiseTokenSource::MaskTokenId => root.get("mask_token_id").filter(|v| !v.is_null()),
            other => root.get(other.key()),
        };
        if let Some(value) = found {
            let key = format!("{prefix}{}", source.key());
            let id = token_id(value, file, &key, input_vocab)?;
            return Ok(NoiseToken { id, source });
        }
    }
    Err(Error::NoNoiseToken {
        file: file.to_string(),
    })
}

/// Check one present noise-token value.
fn token_id(value: &Value, file: &str, key: &str, input_vocab: usize) -> Result<u32> {
    let out_of_range = |id: i64| Error::NoiseTokenOutOfRange {
        file: file.to_string(),
        key: key.to_string(),
        id,
        vocab_size: input_vocab,
    };
    let Some(n) = value.as_number().filter(|n| !n.is_f64()) else {
        return Err(Error::bad_config(
            file,
            key,
            format!(
                "noise token id must be an integer, found {}",
                describe(value)
            ),
        ));
    };
    // An integer beyond i64 (only possible as a huge u64) is certainly out of range.
    let id = n.as_i64().ok_or_else(|| out_of_range(i64::MAX))?;
    match u32::try_from(id) {
        Ok(small) if (small as usize) < input_vocab => Ok(small),
        _ => Err(out_of_range(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resolve(v: Value, vocab: usize) -> Result<NoiseToken> {
        resolve_noise_token(v.as_object().unwrap(), "d.json", vocab)
    }

    #[test]
    fn huge_integer_is_out_of_range() {
        let e = resolve(json!({"pard_token": u64::MAX}), 10).unwrap_err();
        assert_eq!(e.code(), "noise-token-out-of-range");
    }

    #[test]
    fn prefix_is_reported() {
        let e = resolve_noise_token_in(
            json!({"dspark_noise_token_id": "x"}).as_object().unwrap(),
            "text_config.",
            "d.json",
            10,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("`text_config.dspark_noise_token_id`"),
            "{e}"
        );
    }
}
