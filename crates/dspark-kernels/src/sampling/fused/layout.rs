//! The memory layout the fused kernels and their Rust models share: parameter blocks (passed
//! by value to every launch), the records the launches hand each other, and the words they
//! return. Each `#[repr(C)]` struct here is declared field for field in `kernels/*.cu[h]`, whose
//! `static_assert`s and this module's tests pin the sizes.

/// Threads per block of every fused kernel (`DS_NT`).
pub const THREADS: usize = 256;
/// Width of the row chunks verification splits a row into (`VF_CH`).
pub const VF_CHUNK: usize = 8192;
/// Values per thread in a verification chunk (`VF_EPT`).
pub const VF_EPT: usize = VF_CHUNK / THREADS;
/// Requests per verification parameter block (`VF_MAXB`); larger batches run in groups.
pub const VF_MAX_BATCH: usize = 128;
/// Stop ids carried inside the parameter block (`VF_MAX_STOPS`); more are read from memory.
pub const VF_MAX_STOPS: usize = 64;
/// Largest vocabulary of the fused kernels: fixed-point masses (`2^40` per unit weight) of a
/// whole row must fit in a `u64`.
pub const MAX_VOCAB: usize = 1 << 23;
/// One unit of weight in the radix selection's fixed-point masses (`DS_FX_ONE`).
pub const FX_ONE: f32 = 1_099_511_627_776.0;

/// Verification chunks of a `vocab`-wide row.
pub(crate) fn vf_chunks(vocab: usize) -> usize {
    vocab.div_ceil(VF_CHUNK)
}

/// Bias chunks of a row of `valid` draft columns (at least one).
pub(crate) fn sb_chunks(valid: usize) -> usize {
    valid.div_ceil(SB_CHUNK).max(1)
}

/// Requests per block-sampler parameter block (`SB_MAXB`).
pub const SB_MAX_BATCH: usize = 256;
/// Draft columns per bias block of the block sampler (`SB_CH`).
pub const SB_CHUNK: usize = 1024;
/// Columns per thread in a bias block, strided (`SB_CPT`).
pub const SB_CPT: usize = SB_CHUNK / THREADS;
/// Largest Markov rank of the fused block sampler (`SB_RMAX`).
pub const SB_MAX_RANK: usize = 512;
/// Target columns per block of the row fills (`SB_FILL`).
pub const SB_FILL: usize = 8192;

/// Element dtype codes (`DS_F32`, `DS_F16`, `DS_BF16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Dtype {
    /// f32.
    F32 = 0,
    /// IEEE half.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }
}

/// How draft token ids are stored (`tok_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum TokenKind {
    /// i64 (torch's default).
    I64 = 0,
    /// i32.
    I32 = 1,
    /// u32 (dspark's own drafts).
    U32 = 2,
}

/// Row flags of [`VfRow::flags`].
pub mod flag {
    /// The target row holds NaN or `+inf`.
    pub const T_NONFINITE: u32 = 1;
    /// The target row has no finite value.
    pub const T_NOFINITE: u32 = 2;
    /// The draft row holds NaN or `+inf`.
    pub const D_NONFINITE: u32 = 4;
    /// The draft row has no finite value.
    pub const D_NOFINITE: u32 = 8;
    /// The row's draft token is accepted.
    pub const ACCEPT: u32 = 16;
    /// `p` is truncated (`cut_key` / `cut_id` hold the last kept value).
    pub const CUT: u32 = 32;
    /// The truncation includes top-k (draws from `p` go in value order).
    pub const TOPK: u32 = 64;
}

/// Status kinds of a request's status word (`kind << 32 | position`).
pub mod status {
    /// NaN or `+inf` in a target row.
    pub const T_NONFINITE: u32 = 1;
    /// A target row without a finite value.
    pub const T_NOFINITE: u32 = 2;
    /// NaN or `+inf` in a draft row.
    pub const D_NONFINITE: u32 = 3;
    /// A draft row without a finite value.
    pub const D_NOFINITE: u32 = 4;
    /// A draft token outside `[0, V)` (the detail word holds it).
    pub const TOKEN: u32 = 5;
}

/// Status words of the block sampler, per `(request, slot)`.
pub mod sb_status {
    /// NaN or `+inf` in the draft logits.
    pub const NONFINITE: u32 = 1;
    /// No finite draft logit in the valid vocabulary.
    pub const NOFINITE: u32 = 2;
    /// NaN or `+inf` in the base logits (top-k).
    pub const BASE_NONFINITE: u32 = 3;
    /// No finite base logit (top-k).
    pub const BASE_NOFINITE: u32 = 4;
}

/// The block sampler's parameter block (`SbParams`): buffer addresses, shapes, the slot and
/// every request's stream and anchor.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct SbParams {
    /// `[B, K, V_d]` base logits.
    pub base: u64,
    /// `[V_in, r]` Markov W1.
    pub w1: u64,
    /// `[V_d, r]` Markov W2.
    pub w2: u64,
    /// `[V_d]` target id of each draft id (0 without a table).
    pub table: u64,
    /// `[B, K, V_t]` f32 draft logits (output).
    pub out: u64,
    /// `[B, K, r]` f32 embeddings `W1[x_{k-1}]` (output).
    pub emb: u64,
    /// `[B, K]` u32 drafted target ids (output).
    pub tokens: u64,
    /// `[B]` u32 the previous slot's tokens.
    pub prev: u64,
    /// `[B, chunks]` [`SbChunk`]s of the current slot.
    pub stats: u64,
    /// `[B, K, top_k]` u32 candidate ids (top-k).
    pub cand: u64,
    /// `[B, K]` u32 candidate counts (top-k).
    pub ncand: u64,
    /// `[B, K]` u32 [`sb_status`] words.
    pub status: u64,
    /// `[B]` u64 witness hashes.
    pub witness: u64,
    /// Requests in this group.
    pub batch: u32,
    /// `K`.
    pub slots: u32,
    /// `V_d`.
    pub vocab_d: u32,
    /// `V_t`.
    pub vocab_t: u32,
    /// Draft columns that may be drawn: `[0, valid)`.
    pub valid: u32,
    /// Markov rank `r`.
    pub rank: u32,
    /// Bias chunks per row.
    pub nchunks: u32,
    /// The slot of this launch.
    pub slot: u32,
    /// [`Dtype`] of the base logits.
    pub dt_base: u32,
    /// [`Dtype`] of W1.
    pub dt_w1: u32,
    /// [`Dtype`] of W2.
    pub dt_w2: u32,
    /// 1 when greedy.
    pub greedy: u32,
    /// Top-k candidates (0: dense).
    pub top_k: u32,
    /// 1 with a d2t table.
    pub has_table: u32,
    /// Padding.
    pub pad: [u32; 2],
    /// `logit_scale`, divided by the temperature when sampling.
    pub mult: f32,
    /// Padding.
    pub pad2: u32,
    /// Each request's stream ([`crate::sampling::rng::Stream::raw`]).
    pub stream: [u64; SB_MAX_BATCH],
    /// Each request's anchor (a target id).
    pub anchor: [u32; SB_MAX_BATCH],
}

/// Statistics of one bias chunk of one request's row (`SbChunk`): as [`VfChunk`].
pub type SbChunk = VfChunk;

/// One request's settings in a verification parameter block (`VfReq`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
pub struct VfReq {
    /// The request's random stream ([`crate::sampling::rng::Stream::raw`]).
    pub stream: u64,
    /// `1 / temperature` (sampled requests).
    pub s: f32,
    /// Top-p in `(0, 1]`.
    pub top_p: f32,
    /// Top-k (`u32::MAX` when off; off too when `>= V`).
    pub top_k: u32,
    /// Drafts to verify; bit 31 set for greedy requests.
    pub n: u32,
}

impl VfReq {
    /// Drafts to verify.
    pub fn num_draft(&self) -> usize {
        (self.n & 0x7fff_ffff) as usize
    }

    /// Whether the request is greedy.
    pub fn greedy(&self) -> bool {
        self.n >> 31 != 0
    }
}

/// The verification parameter block (`VfParams`): buffer addresses, shapes, stop ids and the
/// requests of one group.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct VfParams {
    /// `[B, K+1, V]` target logits.
    pub target: u64,
    /// `[B, K, V]` draft logits (0 when absent).
    pub draft: u64,
    /// `[B, K]` draft token ids.
    pub tokens: u64,
    /// Sorted stop ids in memory when there are more than [`VF_MAX_STOPS`] (else 0).
    pub stops: u64,
    /// Scratch: one [`VfChunk`] per row and chunk.
    pub chunks: u64,
    /// Scratch: one [`VfRow`] per target row.
    pub rows: u64,
    /// Scratch: one [`VfResid`] per request and chunk.
    pub resid: u64,
    /// Output: `B * (K+5)` i64 words ([`vf_out_words`]).
    pub out: u64,
    /// Requests in this group.
    pub batch: u32,
    /// `K + 1`.
    pub width: u32,
    /// `V`.
    pub vocab: u32,
    /// Chunks per row.
    pub nchunks: u32,
    /// [`Dtype`] of the target logits.
    pub dt_target: u32,
    /// [`Dtype`] of the draft logits.
    pub dt_draft: u32,
    /// [`TokenKind`] of the draft tokens.
    pub tok_kind: u32,
    /// 1 with draft logits.
    pub has_draft: u32,
    /// Number of stop ids.
    pub nstops: u32,
    /// Padding.
    pub pad: [u32; 3],
    /// Sorted stop ids (the first `nstops`, when they fit).
    pub stop: [u32; VF_MAX_STOPS],
    /// The requests (the first `batch`).
    pub req: [VfReq; VF_MAX_BATCH],
}

/// Statistics of one chunk of one row (`VfChunk`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
pub struct VfChunk {
    /// Largest value, NaN-ignoring (`-inf` when none is finite).
    pub max: f32,
    /// Row index of its first occurrence (the chunk's start when `max` is `-inf`).
    pub argmax: u32,
    /// NaN count.
    pub nans: u32,
    /// `Σ exp((x - max)·s)` (0 for rows that need no normalizer).
    pub sum: f32,
}

/// The verdict of one target row (`VfRow`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
pub struct VfRow {
    /// Normalizer of `p` (its kept mass, relative to `m`).
    pub zp: f64,
    /// Normalizer of `q`.
    pub zq: f64,
    /// Kept mass in fixed point (truncated rows).
    pub zfx: u64,
    /// Row max.
    pub m: f32,
    /// Draft row max.
    pub mq: f32,
    /// Key of the last kept value.
    pub cut_key: u32,
    /// Id of the last kept value.
    pub cut_id: u32,
    /// First argmax.
    pub argmax: u32,
    /// [`flag`]s.
    pub flags: u32,
}

/// Residual and kept-`p` mass of one chunk of a request's draw row (`VfResid`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
pub struct VfResid {
    /// `Σ max(p - q, 0)`.
    pub rsum: f32,
    /// `Σ` kept `p` weights relative to the row max.
    pub msum: f32,
}

/// Output words per request: `K + 1` tokens, the accepted count, the status, its detail and
/// the witness (a hash of the request's intermediate records).
pub fn vf_out_words(width: usize) -> usize {
    width + 4
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the kernels' `static_assert`s state.
    #[test]
    fn layouts_match_the_kernels() {
        assert_eq!(size_of::<VfReq>(), 24);
        assert_eq!(
            size_of::<VfParams>(),
            112 + 4 * VF_MAX_STOPS + 24 * VF_MAX_BATCH
        );
        assert_eq!(size_of::<VfChunk>(), 16);
        assert_eq!(size_of::<VfRow>(), 48);
        assert_eq!(size_of::<VfResid>(), 8);
        assert_eq!(size_of::<SbParams>(), 176 + 12 * SB_MAX_BATCH);
        // The parameter blocks fit the classic 4 KiB kernel-parameter limit.
        assert!(size_of::<VfParams>() <= 4096 && size_of::<SbParams>() <= 4096);
    }
}
