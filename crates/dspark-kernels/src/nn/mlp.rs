//! The SwiGLU MLP of a Qwen3 layer.

use candle_core::Tensor;

use super::fused;
use super::linear::Linear;
use crate::error::Result;

/// SwiGLU: `down(silu(gate(x)) ⊙ up(x))`.
pub fn swiglu(x: &Tensor, gate: &Linear, up: &Linear, down: &Linear) -> Result<Tensor> {
    let [g, u] = Linear::forward_many([gate, up], x)?;
    let h = match fused::silu_mul(&g, &u) {
        Some(h) => h?,
        None => (g.silu()? * u)?,
    };
    down.forward(&h)
}
