//! One Qwen3 decoder layer — weights, loading and the pre-norm forward — shared by the
//! drafter (`dspark::Qwen3Drafter`) and the native target (`dspark::models::qwen3::Qwen3Target`).
//!
//! The layer is written once; each model supplies only its attention (the drafter: the block
//! against its fused context, non-causal; the target: new tokens against their KV cache,
//! causal) as a closure to [`Layer::forward`].

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};

use super::linear::Linear;
use super::mlp::swiglu;
use super::norm::rms_norm;
use super::packed::PackedWeight;
use super::quant::Quant;
use super::rope::Rope;
use crate::error::{Error, Result};

/// Takes loaded tensors by canonical name (`model.layers.0.self_attn.q_proj.weight`, ...), and
/// builds linear maps from them, quantized when the model's load asks for it.
pub struct Take {
    tensors: BTreeMap<String, Tensor>,
    quant: Option<Quant>,
    /// Weights already in blocks (a GGUF file's quantized matrices), and the device their maps
    /// go to.
    packed: BTreeMap<String, PackedWeight>,
    device: Device,
}

impl Take {
    /// The loaded `tensors`; linear maps keep their weights' dtype.
    pub fn new(tensors: BTreeMap<String, Tensor>) -> Self {
        Self {
            tensors,
            quant: None,
            packed: BTreeMap::new(),
            device: Device::Cpu,
        }
    }

    /// Linear maps built from here on are quantized as `quant` (`None`: as loaded).
    pub fn quantized(self, quant: Option<Quant>) -> Self {
        Self { quant, ..self }
    }

    /// Weights already in blocks, by name (`{prefix}.weight`): the maps over them keep them as
    /// they are ([`Linear::from_packed`], for `device`), whatever [`Self::quantized`] asked.
    pub fn with_packed(self, packed: BTreeMap<String, PackedWeight>, device: &Device) -> Self {
        Self {
            packed,
            device: device.clone(),
            ..self
        }
    }

    /// The tensor `name`, removed from the set, if it was loaded.
    pub fn take(&mut self, name: &str) -> Option<Tensor> {
        self.tensors.remove(name)
    }

    /// The tensor `name`, removed from the set (`missing-tensor` naming it without `model.`).
    pub fn get(&mut self, name: &str) -> Result<Tensor> {
        self.take(name).ok_or_else(|| Error::MissingTensor {
            tensor: name.strip_prefix("model.").unwrap_or(name).to_string(),
            reason: "not in the load plan".into(),
        })
    }

    /// `{prefix}.weight` (and `{prefix}.bias` when `bias`) as a [`Linear`], quantized when
    /// [`Self::quantized`] asked.
    pub fn linear(&mut self, prefix: &str, bias: bool) -> Result<Linear> {
        if let Some(packed) = self.packed.remove(&format!("{prefix}.weight")) {
            let bias = self.bias(prefix, bias)?;
            return Linear::from_packed(packed, bias, &self.device);
        }
        let weight = self.get(&format!("{prefix}.weight"))?;
        let bias = self.bias(prefix, bias)?;
        match self.quant {
            // A weight the format cannot hold is named as the checkpoint names it.
            Some(quant) => Linear::quantized(weight, bias, quant).map_err(|e| match e {
                Error::InvalidArgument { message, .. } => {
                    Error::invalid(format!("{prefix}.weight"), message)
                }
                other => other,
            }),
            None => Linear::new(weight, bias),
        }
    }

    /// `{prefix}.bias` when the map has one.
    fn bias(&mut self, prefix: &str, bias: bool) -> Result<Option<Tensor>> {
        bias.then(|| self.get(&format!("{prefix}.bias")))
            .transpose()
    }
}

/// The attention shape of a layer and its RMSNorm epsilon.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// RMSNorm epsilon (layer norms and the per-head q/k norms).
    pub eps: f64,
}

/// One Qwen3 decoder layer.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Query projection `[heads·head_dim, H]`.
    pub q_proj: Linear,
    /// Key projection `[kv_heads·head_dim, H]`.
    pub k_proj: Linear,
    /// Value projection `[kv_heads·head_dim, H]`.
    pub v_proj: Linear,
    /// Output projection `[H, heads·head_dim]`.
    pub o_proj: Linear,
    /// Per-head RMSNorm weight on queries `[head_dim]`.
    pub q_norm: Tensor,
    /// Per-head RMSNorm weight on keys `[head_dim]`.
    pub k_norm: Tensor,
    /// SwiGLU gate `[I, H]`.
    pub gate_proj: Linear,
    /// SwiGLU up projection `[I, H]`.
    pub up_proj: Linear,
    /// SwiGLU down projection `[H, I]`.
    pub down_proj: Linear,
    /// RMSNorm weight before attention `[H]`.
    pub input_layernorm: Tensor,
    /// RMSNorm weight before the MLP `[H]`.
    pub post_attention_layernorm: Tensor,
    /// On the device-generic path: q, k and v stacked into one map (the three above are row
    /// views of it), and k and v alone (a view too), and gate and up stacked likewise.
    pub stacked: Option<Stacked>,
}

/// A layer's products stacked for the device-generic path (see [`Linear::stack`]).
#[derive(Debug, Clone)]
pub struct Stacked {
    /// `[q; k; v]`.
    pub qkv: Linear,
    /// `[k; v]`.
    pub kv: Linear,
    /// `[gate; up]`.
    pub gate_up: Linear,
}

/// `x: [N, heads, hd]` → RMS-normed per head with `norm`, then rotated with `(cos, sin)`.
pub fn norm_rope(
    rope: &Rope,
    x: &Tensor,
    norm: &Tensor,
    eps: f64,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<Tensor> {
    rope.apply(&rms_norm(x, norm, eps)?, cos, sin)
}

impl Layer {
    /// The layer under `prefix` (`model.layers.{i}`): attention projections with a bias when
    /// `bias` (`attention_bias`), q/k norms, SwiGLU MLP, the two layer norms.
    pub fn load(t: &mut Take, prefix: &str, bias: bool) -> Result<Self> {
        let p = prefix;
        let mut layer = Self {
            q_proj: t.linear(&format!("{p}.self_attn.q_proj"), bias)?,
            k_proj: t.linear(&format!("{p}.self_attn.k_proj"), bias)?,
            v_proj: t.linear(&format!("{p}.self_attn.v_proj"), bias)?,
            o_proj: t.linear(&format!("{p}.self_attn.o_proj"), bias)?,
            q_norm: t.get(&format!("{p}.self_attn.q_norm.weight"))?,
            k_norm: t.get(&format!("{p}.self_attn.k_norm.weight"))?,
            gate_proj: t.linear(&format!("{p}.mlp.gate_proj"), false)?,
            up_proj: t.linear(&format!("{p}.mlp.up_proj"), false)?,
            down_proj: t.linear(&format!("{p}.mlp.down_proj"), false)?,
            input_layernorm: t.get(&format!("{p}.input_layernorm.weight"))?,
            post_attention_layernorm: t.get(&format!("{p}.post_attention_layernorm.weight"))?,
            stacked: None,
        };
        layer.stack()?;
        Ok(layer)
    }

    /// Stack the products that read one input ([`Stacked`]) when the weights are candle
    /// tensors (the device-generic path); packed host weights are grouped per call instead.
    fn stack(&mut self) -> Result<()> {
        let Some(qkv) = Linear::stack(&mut [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj])?
        else {
            return Ok(());
        };
        let Some(gate_up) = Linear::stack(&mut [&mut self.gate_proj, &mut self.up_proj])? else {
            return Ok(());
        };
        let q_out = self.q_proj.out_dim();
        let kv_out = self.k_proj.out_dim() + self.v_proj.out_dim();
        if let Some(kv) = qkv.rows(q_out, kv_out)? {
            self.stacked = Some(Stacked { qkv, kv, gate_up });
        }
        Ok(())
    }

    /// `k` and `v` of `x` (`[N, H]` → two `[N, kv·hd]`), in one product where stacked.
    pub fn kv(&self, x: &Tensor) -> Result<[Tensor; 2]> {
        match &self.stacked {
            Some(s) => {
                let y = s.kv.forward(x)?;
                let k_out = self.k_proj.out_dim();
                Ok([
                    y.narrow(1, 0, k_out)?,
                    y.narrow(1, k_out, self.v_proj.out_dim())?,
                ])
            }
            None => Linear::forward_many([&self.k_proj, &self.v_proj], x),
        }
    }

    /// The dtype the layer's matrices are kept in (its query projection's: a checkpoint
    /// stores a layer's matrices in one dtype).
    pub fn weight_dtype(&self) -> crate::nn::WeightDtype {
        self.q_proj.weight_dtype()
    }

    /// Bytes of the layer's matrices (what one forward reads of it, norms aside).
    pub fn weight_bytes(&self) -> usize {
        [
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.o_proj,
            &self.gate_proj,
            &self.up_proj,
            &self.down_proj,
        ]
        .iter()
        .map(|l| l.weight_bytes())
        .sum()
    }

    /// The pre-norm layer over `x: [N, H]` (rows of any number of requests, packed), with
    /// `(cos, sin)` tables for the `N` rows' positions:
    /// `x + o(attend(q, k, v))`, then `+ mlp(post_norm(·))`. `attend` receives
    /// `q: [N, heads, hd]`, `k, v: [N, kv_heads, hd]` (q and k normed per head and rotated)
    /// and returns `[N, heads·hd]`.
    pub fn forward(
        &self,
        x: &Tensor,
        g: Heads,
        rope: &Rope,
        cos: &Tensor,
        sin: &Tensor,
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let n = x.dims().first().copied().unwrap_or(0);
        let (heads, kvh, hd, eps) = (g.heads, g.kv_heads, g.head_dim, g.eps);
        let h = rms_norm(x, &self.input_layernorm, eps)?;
        let [q, k, v] = match &self.stacked {
            Some(st) => {
                let y = st.qkv.forward(&h)?;
                let (qo, ko) = (self.q_proj.out_dim(), self.k_proj.out_dim());
                [
                    y.narrow(1, 0, qo)?,
                    y.narrow(1, qo, ko)?,
                    y.narrow(1, qo + ko, self.v_proj.out_dim())?,
                ]
            }
            None => Linear::forward_many([&self.q_proj, &self.k_proj, &self.v_proj], &h)?,
        };
        let q = norm_rope(
            rope,
            &q.reshape((n, heads, hd))?,
            &self.q_norm,
            eps,
            cos,
            sin,
        )?;
        let k = norm_rope(rope, &k.reshape((n, kvh, hd))?, &self.k_norm, eps, cos, sin)?;
        let v = v.reshape((n, kvh, hd))?;
        let attn = attend(&q, &k, &v)?;
        let x = (x + self.o_proj.forward(&attn)?)?;
        let h = rms_norm(&x, &self.post_attention_layernorm, eps)?;
        let mlp = match &self.stacked {
            Some(st) => {
                let y = st.gate_up.forward(&h)?;
                let inter = self.gate_proj.out_dim();
                let (g, u) = (y.narrow(1, 0, inter)?, y.narrow(1, inter, inter)?);
                self.down_proj.forward(&(g.silu()? * u)?)?
            }
            None => swiglu(&h, &self.gate_proj, &self.up_proj, &self.down_proj)?,
        };
        Ok((&x + mlp)?)
    }
}
