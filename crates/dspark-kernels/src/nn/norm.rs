//! RMSNorm.

use candle_core::{D, Tensor};

use super::fused;
use crate::error::Result;

/// `x · rsqrt(mean(x², last dim) + eps) · weight`, computed in `f32`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if let Some(y) = fused::rms_norm(x, weight, eps) {
        return y;
    }
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (var + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(weight)?)
}
