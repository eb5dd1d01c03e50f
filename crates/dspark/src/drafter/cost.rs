//! What one block pass of the [`Qwen3Drafter`] costs, by its shape ([`ForwardCost`]): the
//! policy's prior for proposing, before a proposal has been timed.
//!
//! A proposal runs a block of rows per request through the drafter's layers and its output
//! head (every row of the block is a draft slot), so a pass over `n` rows reads the layers'
//! and the head's weights once and multiplies them by each row. The context's attention and
//! the Markov and confidence heads (rank-`r` and one-row products) are left out: they are
//! small beside the head at the drafter's widths.

use super::Qwen3Drafter;
use crate::models::ForwardCost;
use crate::nn::decoder::Layer;

impl Qwen3Drafter {
    /// The cost of a block pass, by shape (see the module docs): its `flops_per_token` is per
    /// row of the block.
    pub(crate) fn block_cost(&self) -> ForwardCost {
        let shape = &self.spec.shape;
        let head_rows = self.info.vocab.draft;
        let weights = shape.num_hidden_layers * ForwardCost::layer_weights(shape)
            + head_rows * shape.hidden_size;
        let layers: usize = self.layers.iter().map(Layer::weight_bytes).sum();
        let head = match (&self.head, &self.lm_head) {
            (Some(h), _) => h.weight_bytes(),
            (None, Some(w)) => w.elem_count() * w.dtype().size_in_bytes(),
            (None, None) => 0,
        };
        let dtype = self
            .layers
            .first()
            .map_or_else(|| self.fc.weight_dtype(), Layer::weight_dtype);
        ForwardCost {
            weight_bytes: (layers + head).max(1) as f64,
            flops_per_token: 2.0 * weights.max(1) as f64,
            layers: shape.num_hidden_layers,
            dtype,
            quant: self.fc.quant(),
            layer_seconds: None,
        }
    }
}
