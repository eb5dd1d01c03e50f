//! Documented size limits of every public entry point.
//!
//! The boundary rule: every entry point validates before it allocates. Sizes derived from
//! arguments, configs or file headers are computed with checked arithmetic and compared with
//! these limits first; anything above is refused with [`Error::TooLarge`] (code `too-large`)
//! naming the argument, key or file. The limits sit far above every real model (the largest
//! published vocabularies are ~262k, the deepest targets ~128 layers) and far below what would
//! exhaust a machine.

use crate::error::{Error, Result};

/// Largest number of elements one kernel output (or scratch buffer) may have: 2^31
/// (8 GiB of f32).
pub const MAX_OUTPUT_ELEMENTS: u64 = 1 << 31;
/// Largest vocabulary (`vocab_size`, `draft_vocab_size`, `target_vocab_size`): 2^22
/// (4,194,304; 16x the largest published vocabulary). It also bounds what `inspect` may read
/// and hold for a `d2t` table (32 MiB of `I64` plus a 16 MiB map), which keeps `inspect`
/// well under its 256 MB budget whatever a checkpoint claims.
pub const MAX_VOCAB: u64 = 1 << 22;
/// Largest layer count (`num_hidden_layers`, target or drafter, `n_mtp_layers`,
/// `num_target_layers`); target layer ids must lie below it.
pub const MAX_LAYERS: u64 = 4096;
/// Largest hidden or intermediate size.
pub const MAX_HIDDEN: u64 = 1 << 20;
/// Largest attention head count (query or key/value heads) and head dimension.
pub const MAX_HEADS: u64 = 1 << 14;
/// Largest block size (draft slots per round) and Markov rank.
pub const MAX_BLOCK: u64 = 1 << 16;
/// Largest batch (requests per call) of the verify-length policies, whose `[B]` output does
/// not shrink with an empty `[B, 0]` input: 2^20.
pub const MAX_BATCH: u64 = 1 << 20;
/// Largest absolute token position a drafter context may start at: 2^24 (RoPE angles are
/// computed in f32, which stops telling positions apart well before that; no released model
/// has a context that long).
pub const MAX_POSITION: u64 = 1 << 24;
/// Largest number of tensors in one safetensors header, and in one checkpoint (all shards
/// together): 2^18 (the largest published checkpoints hold ~10^5). It bounds what `inspect`
/// keeps per checkpoint to well under its 256 MB budget.
pub const MAX_TENSORS: u64 = 1 << 18;
/// Largest total length of the tensor names of one checkpoint (all shards together): 16 MiB
/// (64 bytes a name at [`MAX_TENSORS`]; real names average ~50). With [`MAX_TENSORS`] it
/// bounds `inspect`'s memory whatever a checkpoint holds: ~216 MB measured at both limits.
pub const MAX_NAME_BYTES: u64 = 16 << 20;
/// Largest `config.json` (or `sts.json`) read: 16 MiB.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Largest `model.safetensors.index.json` read: 64 MiB.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Product of `dims` with checked arithmetic, refused above [`MAX_OUTPUT_ELEMENTS`].
///
/// `name` names the argument the size comes from, for the error.
pub fn output_elements(name: &str, dims: &[u64]) -> Result<usize> {
    let mut total: u128 = 1;
    for &d in dims {
        total = total.saturating_mul(u128::from(d));
    }
    if total > u128::from(MAX_OUTPUT_ELEMENTS) {
        return Err(Error::too_large(
            name,
            total,
            MAX_OUTPUT_ELEMENTS,
            " elements",
        ));
    }
    usize::try_from(total).map_err(|_| Error::too_large(name, total, usize::MAX, " elements"))
}

/// `value` as a size, refused above `limit` with [`Error::TooLarge`] naming `name`.
pub fn at_most(name: &str, value: u64, limit: u64) -> Result<usize> {
    if value > limit {
        return Err(Error::too_large(name, value, limit, ""));
    }
    usize::try_from(value).map_err(|_| Error::too_large(name, value, usize::MAX, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_elements_is_checked_and_bounded() {
        assert_eq!(output_elements("x", &[2, 3, 4]).ok(), Some(24));
        assert_eq!(output_elements("x", &[]).ok(), Some(1));
        assert_eq!(output_elements("x", &[0, u64::MAX]).ok(), Some(0));
        let e = output_elements("draft_logits", &[1, 2, (1 << 32) - 1]).unwrap_err();
        assert_eq!(e.code(), "too-large");
        assert!(e.to_string().contains("draft_logits"), "{e}");
        let e = output_elements("x", &[u64::MAX, u64::MAX, u64::MAX]).unwrap_err();
        assert_eq!(e.code(), "too-large");
    }

    #[test]
    fn at_most_names_the_argument() {
        assert_eq!(at_most("k", 5, 5).ok(), Some(5));
        let e = at_most("num_hidden_layers", 10_000_000, MAX_LAYERS).unwrap_err();
        assert_eq!(e.code(), "too-large");
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    }
}
