//! The model layers the drafter and the native target are built from, written once.
//!
//! - [`linear`]: [`Linear`] (packed panels on the host, a candle weight elsewhere);
//! - [`matmul`]: [`matmul_t`], the small-row product of everything else;
//! - [`packed`]: the panel-packed weight and its register-tiled kernel (x86 bodies in
//!   `packed/x86.rs`);
//! - [`quant`]: quantized weights in GGUF's blocks (Q8_0: [`quant::QuantMatrix`]; Q4_K:
//!   [`quant::q4k::Q4KMatrix`]; Q6_K: [`quant::q6k::Q6KMatrix`]) and their products over
//!   activations quantized per row;
//! - [`attention`]: grouped-query attention, non-causal (the drafter's block) and causal over a
//!   KV cache (the target), with the host kernels in `attention/kernel.rs`;
//! - [`norm`], [`rope`], [`mlp`]: RMSNorm, rotary embeddings, the SwiGLU MLP;
//! - `decoder`: one Qwen3 decoder layer (its weights, loading and pre-norm forward), whose
//!   attention each model supplies;
//! - `fused`: the single-pass host bodies of these ops, taken for contiguous f32 CPU tensors
//!   on the fast kernel path ([`crate::device::host_fast`]);
//! - [`weights`]: safetensors → tensors, and the weights a target shares with its drafter;
//! - [`gguf`]: GGUF files → float tensors and quantized blocks, checked before any is read;
//! - [`dtype`]: the dtype weight matrices are kept in ([`WeightDtype`]: f32, or bf16 / f16
//!   read as 2 bytes and widened in registers) and the [`LoadOptions`] that choose it.
//!
//! Every op here is a candle-op front: the host shortcut first, else the device-generic path
//! (what a CUDA device runs, and the CPU under `DSPARK_KERNEL_PATH=tensor`).

pub mod attention;
pub mod decoder;
pub mod dtype;
pub mod fused;
pub mod gguf;
pub mod linear;
pub mod matmul;
pub mod mlp;
pub mod norm;
pub mod packed;
pub mod quant;
pub mod rope;
pub mod vocab;
pub mod weights;

pub use crate::cpu::par::PAR_MIN_MACS;
pub use attention::{causal_gqa_attention, causal_gqa_attention_kt, gqa_attention, softmax_last};
pub use dtype::{DEFAULT_KV_DTYPE, LoadOptions, WeightDtype};
pub use linear::{Linear, PACKED_HEAD_MAX, f32_of, output_head};
pub use matmul::{SMALL_ROWS, matmul_t};
pub use mlp::swiglu;
pub use norm::rms_norm;
pub use rope::Rope;
pub use vocab::VocabWeight;
pub use weights::SharedWeights;
