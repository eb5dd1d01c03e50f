//! Log-probabilities as clients see them: each token as its text and its bytes.
//!
//! A byte-level BPE vocabulary (GPT-2's, Qwen's) spells each token's bytes in printable
//! characters; mapping them back gives the token's exact bytes, so a character split over two
//! tokens shows as its two byte runs (OpenAI's `bytes`), with the text lossy where the bytes
//! are not whole UTF-8. Other tokenizers give the token's own decode.

use std::collections::HashMap;

use dspark::sampling::TokenLogprob;
use tokenizers::{DecoderWrapper, Tokenizer};

/// One token: its text and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The text (U+FFFD where the bytes are not whole UTF-8).
    pub text: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One generated token's entry: the token, its log-probability and the likeliest tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    /// The token.
    pub token: Piece,
    /// Its log-probability.
    pub logprob: f32,
    /// The likeliest tokens at its position, most likely first.
    pub top: Vec<(Piece, f32)>,
}

/// The characters a byte-level vocabulary spells byte `b` with: the printable bytes stand for
/// themselves, the others (controls, space, DEL, the Latin-1 gaps) take the characters from
/// U+0100 up, in byte order.
fn byte_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

/// Turns token ids into [`Piece`]s for one tokenizer.
#[derive(Debug)]
pub struct Pieces {
    byte_level: Option<HashMap<char, u8>>,
}

impl Pieces {
    /// For `tokenizer` (byte-level when its decoder is).
    pub fn new(tokenizer: &Tokenizer) -> Self {
        let byte_level =
            matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))).then(byte_chars);
        Self { byte_level }
    }

    /// Token `id` of `tokenizer`.
    pub fn piece(&self, tokenizer: &Tokenizer, id: u32) -> Piece {
        if let (Some(map), Some(spelled)) = (&self.byte_level, tokenizer.id_to_token(id)) {
            let bytes: Option<Vec<u8>> = spelled.chars().map(|c| map.get(&c).copied()).collect();
            if let Some(bytes) = bytes {
                return Piece {
                    text: String::from_utf8_lossy(&bytes).into_owned(),
                    bytes,
                };
            }
            // An added token spelled outside the byte alphabet: its decode below.
        }
        let text = tokenizer.decode(&[id], false).unwrap_or_default();
        Piece {
            bytes: text.clone().into_bytes(),
            text,
        }
    }

    /// The client's entry of `lp`.
    pub fn entry(&self, tokenizer: &Tokenizer, lp: &TokenLogprob) -> LogprobEntry {
        LogprobEntry {
            token: self.piece(tokenizer, lp.token),
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(id, v)| (self.piece(tokenizer, id), v))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_a_bijection() {
        let map = byte_chars();
        assert_eq!(map.len(), 256);
        let mut bytes: Vec<u8> = map.values().copied().collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
        // GPT-2's spelling of a space and a newline.
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }

    #[test]
    fn the_bundled_tokens_bytes_join_to_the_text() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../python/dspark/models/tiny/target/tokenizer.json");
        let tok = Tokenizer::from_file(path).unwrap();
        let pieces = Pieces::new(&tok);
        assert!(pieces.byte_level.is_some());
        let text = "Hello, world:\n naïve café — 日本 🙂 end";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| pieces.piece(&tok, id).bytes)
            .collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
        // A whole-ASCII token's text is its bytes.
        let p = pieces.piece(&tok, ids[0]);
        assert_eq!(p.text.as_bytes(), p.bytes.as_slice());
    }
}
