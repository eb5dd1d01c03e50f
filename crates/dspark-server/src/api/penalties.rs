//! `presence_penalty`, `frequency_penalty`, `repetition_penalty` (a dspark extension, as in
//! vLLM) and `logit_bias` read into the engine's [`Penalties`]: each bad value a 400 naming its
//! field.

use dspark::engine::{MAX_LOGIT_BIAS, Penalties};
use serde_json::{Map, Value};

use super::error::ApiError;

/// A penalty in `[-2, 2]` (absent: 0).
fn bounded(field: &str, v: Option<f64>) -> Result<f32, ApiError> {
    match v {
        None => Ok(0.0),
        Some(v) if (-2.0..=2.0).contains(&v) => Ok(v as f32),
        Some(v) => Err(ApiError::invalid(
            field,
            format!("{field} must be a number in [-2, 2], got {v}"),
        )),
    }
}

/// `logit_bias`: token id (a decimal string) to a bias in `[-100, 100]`.
fn bias(map: Option<&Map<String, Value>>, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} entries"),
        ));
    }
    map.iter()
        .map(|(key, value)| {
            let id = match key.trim().parse::<u32>() {
                Ok(id) if (id as usize) < vocab_size => id,
                _ => {
                    return Err(ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias key {key:?} is not a token id in [0, {vocab_size})"),
                    ));
                }
            };
            match value.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias: token {id}: the bias must be a number in [-100, 100], got {value}"),
                )),
            }
        })
        .collect()
}

/// The request's penalties.
pub fn penalties(
    presence: Option<f64>,
    frequency: Option<f64>,
    repetition: Option<f64>,
    logit_bias: Option<&Map<String, Value>>,
    vocab_size: usize,
) -> Result<Penalties, ApiError> {
    let repetition = match repetition {
        None => 1.0,
        Some(r) if r.is_finite() && r > 0.0 && r <= f64::from(f32::MAX) => r as f32,
        Some(r) => {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("repetition_penalty must be a finite number > 0, got {r}"),
            ));
        }
    };
    Ok(Penalties {
        presence: bounded("presence_penalty", presence)?,
        frequency: bounded("frequency_penalty", frequency)?,
        repetition,
        logit_bias: bias(logit_bias, vocab_size)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_and_their_errors() {
        let map = |v: Value| v.as_object().cloned().unwrap();
        let p = penalties(
            Some(0.5),
            Some(-1.0),
            Some(1.2),
            Some(&map(json!({"3": 2.5, "7": -100}))),
            10,
        )
        .unwrap();
        assert_eq!((p.presence, p.frequency, p.repetition), (0.5, -1.0, 1.2));
        assert_eq!(p.logit_bias.len(), 2);
        assert_eq!(
            penalties(None, None, None, None, 10).unwrap(),
            Penalties::default()
        );
        for (args, field) in [
            ((Some(2.5), None, None, None), "presence_penalty"),
            ((None, Some(f64::NAN), None, None), "frequency_penalty"),
            ((None, None, Some(0.0), None), "repetition_penalty"),
            ((None, None, None, Some(json!({"10": 1}))), "logit_bias"),
            ((None, None, None, Some(json!({"x": 1}))), "logit_bias"),
            ((None, None, None, Some(json!({"1": 101}))), "logit_bias"),
            ((None, None, None, Some(json!({"1": "2"}))), "logit_bias"),
        ] {
            let m = args.3.map(map);
            let e = penalties(args.0, args.1, args.2, m.as_ref(), 10).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert_eq!(e.param.as_deref(), Some(field));
        }
    }
}
