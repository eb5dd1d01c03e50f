//! The dtype a model keeps its weight matrices in, and the load options that choose it.
//!
//! Arithmetic is always `f32`: activations, accumulators and results. Only the stored weight
//! matrices (every linear map, the embedding and the output head) may be 2 bytes: bf16 and f16
//! weights are widened to f32 in registers inside the product kernels (exactly: both widen
//! without rounding), so a memory-bound decode reads each weight's 2 bytes, not 4. Norm
//! weights and the drafter's small heads stay `f32`.

use candle_core::DType;

use super::quant::Quant;
use crate::error::{Error, Result};

/// The dtype weight matrices are stored in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half precision.
    F16,
}

impl WeightDtype {
    /// Every dtype, in the order of [`WeightDtype::NAMES`].
    pub const ALL: [WeightDtype; 3] = [Self::F32, Self::BF16, Self::F16];

    /// The canonical names (torch's), as accepted by [`WeightDtype::parse`].
    pub const NAMES: [&'static str; 3] = ["float32", "bfloat16", "float16"];

    /// Parse a dtype name for the argument `name`: `float32` / `f32` / `fp32`, `bfloat16` /
    /// `bf16`, `float16` / `f16` / `fp16` / `half` (case-insensitive; a `torch.` prefix is
    /// ignored). Errors: `invalid-argument` naming `name` and the accepted values.
    pub fn parse(name: &str, value: &str) -> Result<Self> {
        let v = value.trim().to_ascii_lowercase();
        Ok(match v.strip_prefix("torch.").unwrap_or(&v) {
            "float32" | "f32" | "fp32" => Self::F32,
            "bfloat16" | "bf16" => Self::BF16,
            "float16" | "f16" | "fp16" | "half" => Self::F16,
            _ => {
                return Err(Error::invalid(
                    name,
                    format!(
                        "`{value}` is not a weight dtype: expected one of {}",
                        Self::NAMES.join(", ")
                    ),
                ));
            }
        })
    }

    /// [`WeightDtype::parse`] for the argument `arg`, whose error says the value is not `what`
    /// and lists the names (then `more`).
    fn parse_as(arg: &str, value: &str, what: &str, more: &str) -> Result<Self> {
        Self::parse(arg, value).map_err(|_| {
            Error::invalid(
                arg,
                format!(
                    "`{value}` is not {what}: expected one of {}{more}",
                    Self::NAMES.join(", ")
                ),
            )
        })
    }

    /// The canonical name (`float32`, `bfloat16`, `float16`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::BF16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::BF16 | Self::F16 => 2,
        }
    }

    /// `t` rounded to this dtype's values (to nearest even), in `t`'s own dtype (a cheap handle
    /// copy for `F32`).
    pub fn round(self, t: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        Ok(match self {
            Self::F32 => t.clone(),
            _ => t.to_dtype(self.candle())?.to_dtype(t.dtype())?,
        })
    }

    /// The candle dtype.
    pub fn candle(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::BF16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }

    /// The weight dtype of a candle dtype (`None` for integers and f64, which load as f32
    /// weights by default).
    pub fn of_candle(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(Self::F32),
            DType::BF16 => Some(Self::BF16),
            DType::F16 => Some(Self::F16),
            _ => None,
        }
    }

    /// The weight dtype a tensor stored as safetensors `dtype` keeps by default: its own for
    /// `F32`, `BF16` and `F16`; `F32` for anything else (`F64` is narrowed).
    pub fn of_safetensors(dtype: &str) -> Self {
        match dtype {
            "BF16" => Self::BF16,
            "F16" => Self::F16,
            _ => Self::F32,
        }
    }
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a model's weights are loaded (`dspark::Qwen3Target::load_with`,
/// `dspark::Qwen3Drafter::builder`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The dtype of the weight matrices. `None` (the default): each matrix keeps the dtype it
    /// has in the checkpoint (f32, bf16 or f16; f64 becomes f32). `Some(F32)` widens every
    /// matrix at load; `Some(BF16)` / `Some(F16)` round wider ones to nearest even.
    ///
    /// On the device-generic path (a CUDA device, or `DSPARK_KERNEL_PATH=tensor`) the matrices
    /// are kept as `f32` tensors holding these values (rounded to the chosen dtype first), so
    /// both paths compute the same model.
    pub dtype: Option<WeightDtype>,
    /// Quantize the decoder layers' linear maps at load (a native target's `q8_0` or `q4_k`; on
    /// the host path its output head and embedding too, in [`Quant::head`]'s format, held once
    /// when tied); the norms keep [`Self::dtype`]. `None`: no quantization. On the
    /// device-generic path the maps hold the quantized values as f32 tensors (the embedding and
    /// head as stored).
    pub quant: Option<Quant>,
    /// The element type of a native target's KV cache (`float32`, `float16` or `bfloat16`;
    /// arithmetic stays f32, keys and values are rounded to nearest even as they are written).
    /// `None`: [`DEFAULT_KV_DTYPE`]. On the device-generic path the cache holds the rounded
    /// values as f32 tensors, so both paths compute the same model.
    pub kv_dtype: Option<WeightDtype>,
}

/// A native target's KV cache dtype when [`LoadOptions::kv_dtype`] is `None`.
pub const DEFAULT_KV_DTYPE: WeightDtype = WeightDtype::F16;

impl LoadOptions {
    /// Options with `dtype` parsed from a name: a weight dtype ([`WeightDtype::parse`]), or a
    /// quantized format (`q8_0`, `q4_k`: [`Quant::parse`]; the layers' maps quantized, the rest as
    /// stored). Errors naming `dtype` list both kinds; `None` keeps the checkpoint's dtypes.
    pub fn with_dtype_name(dtype: Option<&str>) -> Result<Self> {
        let Some(name) = dtype else {
            return Ok(Self::default());
        };
        if let Some(quant) = Quant::parse(name) {
            return Ok(Self {
                dtype: None,
                quant: Some(quant),
                kv_dtype: None,
            });
        }
        let more = format!(", or a quantized format ({})", super::quant::QUANT_NAMES);
        let dtype = WeightDtype::parse_as("dtype", name, "a weight dtype", &more)?;
        Ok(Self {
            dtype: Some(dtype),
            quant: None,
            kv_dtype: None,
        })
    }

    /// These options with the KV cache dtype parsed from a name (`None`: the default).
    /// Errors: `invalid-argument` naming `kv_dtype` and listing the choices.
    pub fn with_kv_dtype_name(self, name: Option<&str>) -> Result<Self> {
        let Some(name) = name else {
            return Ok(Self {
                kv_dtype: None,
                ..self
            });
        };
        let kv = WeightDtype::parse_as("kv_dtype", name, "a KV cache dtype", "")?;
        Ok(Self {
            kv_dtype: Some(kv),
            ..self
        })
    }

    /// The KV cache dtype these options give (the default when unset).
    pub fn kv_dtype_or_default(&self) -> WeightDtype {
        self.kv_dtype.unwrap_or(DEFAULT_KV_DTYPE)
    }

    /// The dtype a matrix stored as safetensors `stored` is kept in.
    pub fn matrix_dtype(&self, stored: &str) -> WeightDtype {
        self.dtype
            .unwrap_or_else(|| WeightDtype::of_safetensors(stored))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_ones_name_the_argument() {
        for (d, name) in WeightDtype::ALL.iter().zip(WeightDtype::NAMES) {
            assert_eq!(WeightDtype::parse("dtype", name).unwrap(), *d);
            assert_eq!(d.as_str(), name);
            assert_eq!(WeightDtype::of_candle(d.candle()), Some(*d));
        }
        assert_eq!(
            WeightDtype::parse("dtype", " torch.BFloat16").unwrap(),
            WeightDtype::BF16
        );
        assert_eq!(
            WeightDtype::parse("dtype", "half").unwrap(),
            WeightDtype::F16
        );
        let e = WeightDtype::parse("dtype", "int8").unwrap_err();
        assert_eq!(e.code(), "invalid-argument");
        let text = e.to_string();
        assert!(
            text.contains("dtype") && text.contains("bfloat16"),
            "{text}"
        );
        let e = LoadOptions::with_dtype_name(Some("float64")).unwrap_err();
        assert!(e.to_string().contains("q8_0, q4_k"), "{e}");
        let e = LoadOptions::with_dtype_name(Some("q3_k")).unwrap_err();
        assert_eq!(e.code(), "invalid-argument");
        let q = LoadOptions::with_dtype_name(Some("Q8_0")).unwrap();
        assert_eq!((q.dtype, q.quant), (None, Some(Quant::Q8_0)));
        assert_eq!(
            LoadOptions::with_dtype_name(None).unwrap(),
            LoadOptions::default()
        );
    }

    #[test]
    fn the_default_keeps_each_stored_dtype() {
        let keep = LoadOptions::default();
        assert_eq!(keep.matrix_dtype("BF16"), WeightDtype::BF16);
        assert_eq!(keep.matrix_dtype("F16"), WeightDtype::F16);
        assert_eq!(keep.matrix_dtype("F64"), WeightDtype::F32);
        let wide = LoadOptions {
            dtype: Some(WeightDtype::F32),
            ..LoadOptions::default()
        };
        assert_eq!(wide.matrix_dtype("BF16"), WeightDtype::F32);
    }
}
