//! [`ForwardCost`]: what one forward of a target costs by its shape, which a target states (or
//! the scheduler estimates) so that its cost model has a prior before any forward is timed
//! (the policy room's `prior`). A drafter states the same of its block pass, so that the
//! policy can price a proposal before it has timed one.

use crate::config::ModelShape;
use crate::error::{Error, Result};
use crate::nn::WeightDtype;
use crate::nn::quant::Quant;

/// What one forward of a target (or one block pass of a drafter) costs, by its shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwardCost {
    /// Bytes of weights one forward reads whatever its token count: every layer's matrices
    /// and the output head, in their kept dtype.
    pub weight_bytes: f64,
    /// Floating-point operations per token through those matrices (a multiply-add counts 2).
    pub flops_per_token: f64,
    /// Decoder layers.
    pub layers: usize,
    /// The dtype the weights are kept in (it sets the kernels' multiply rate).
    pub dtype: WeightDtype,
    /// The quantized format of the layers' matrices, if any: it sets the multiply rate in
    /// place of `dtype` (the integer kernels' rate, not the panels').
    pub quant: Option<Quant>,
    /// Seconds a layer spends issuing its operations whatever its tokens (`None`: the engine's
    /// own, a few microseconds on a CPU and more on a device; a target driven from Python
    /// spends about 0.1 ms).
    pub layer_seconds: Option<f64>,
}

impl ForwardCost {
    /// The cost of a forward by shape alone, for a target that does not state its own: a
    /// decoder of `layers` layers of width `hidden` (attention `4·H²`, a gated MLP of width
    /// `3·H`: `13·H²` weights a layer) and an output head of `vocab` rows, with weights of
    /// `dtype`.
    pub fn estimate(layers: usize, hidden: usize, vocab: usize, dtype: WeightDtype) -> Self {
        let h = hidden as f64;
        let weights = layers as f64 * 13.0 * h * h + vocab as f64 * h;
        Self {
            weight_bytes: weights * dtype.size() as f64,
            flops_per_token: 2.0 * weights,
            layers,
            dtype,
            quant: None,
            layer_seconds: None,
        }
    }

    /// Weights of one Qwen3-shaped decoder layer of `shape`: the attention projections and
    /// the gated MLP.
    pub fn layer_weights(shape: &ModelShape) -> usize {
        let (h, d) = (shape.hidden_size, shape.head_dim);
        let q = shape.num_attention_heads * d;
        let kv = shape.num_key_value_heads * d;
        h * (2 * q + 2 * kv) + 3 * h * shape.intermediate_size
    }

    /// `invalid-argument` unless the byte and operation counts are finite and positive.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("forward_cost.weight_bytes", self.weight_bytes),
            ("forward_cost.flops_per_token", self.flops_per_token),
            (
                "forward_cost.layer_seconds",
                self.layer_seconds.unwrap_or(1.0),
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::invalid(name, format!("{v}: must be finite and > 0")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_layers_and_head() {
        let c = ForwardCost::estimate(2, 64, 1000, WeightDtype::BF16);
        let weights = 2.0 * 13.0 * 64.0 * 64.0 + 1000.0 * 64.0;
        assert_eq!(c.weight_bytes, 2.0 * weights);
        assert_eq!(c.flops_per_token, 2.0 * weights);
        c.validate().unwrap();
    }

    #[test]
    fn bad_counts_are_typed() {
        let mut c = ForwardCost::estimate(2, 64, 1000, WeightDtype::F32);
        c.weight_bytes = f64::NAN;
        assert_eq!(c.validate().unwrap_err().code(), "invalid-argument");
        c.weight_bytes = 1.0;
        c.flops_per_token = 0.0;
        assert_eq!(c.validate().unwrap_err().code(), "invalid-argument");
        c.flops_per_token = 1.0;
        c.layer_seconds = Some(-1.0);
        assert_eq!(c.validate().unwrap_err().code(), "invalid-argument");
    }
}
