//! Incremental detokenization with stop strings.
//!
//! Tokens arrive one at a time; text is released only when it is final:
//!
//! - **Never broken UTF-8.** Each new token's text is the difference between decoding a short
//!   window of ids with and without it (the prefix/read offsets TGI and vLLM use). While that
//!   decode ends in U+FFFD (a character whose bytes are split over tokens), nothing is
//!   released; the next token completes it.
//! - **Stop strings across token boundaries.** Released text never ends in anything that could
//!   still become a stop string: a suffix that is a proper prefix of a stop string is held
//!   back until the next token decides. So a stop string can only start in held-back text, and
//!   once one appears the text is cut right before it (the stop string is not returned).
//!
//! Decoding starts from the last few prompt tokens (as vLLM does), so a tokenizer whose
//! decoder strips a leading space from the first token does not strip it from the first
//! generated one.

use std::sync::Arc;

use tokenizers::Tokenizer;

/// Prompt tokens the first decode windows start from.
pub const CONTEXT_TOKENS: usize = 5;

/// Turns generated token ids into text as they arrive; see the module docs.
pub struct Detokenizer {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Generated text decoded so far (cut at a stop string when one matched).
    text: String,
    /// Bytes of `text` already released.
    released: usize,
    stops: Vec<String>,
    stopped: bool,
}

/// A tokenizer failure (the request then fails).
#[derive(Debug, thiserror::Error)]
#[error("detokenization failed: {0}")]
pub struct DetokError(String);

impl Detokenizer {
    /// A detokenizer for a request whose prompt ends with `prompt` (only its last
    /// [`CONTEXT_TOKENS`] are used), stopping at any of `stops`.
    pub fn new(tokenizer: Arc<Tokenizer>, prompt: &[u32], stops: Vec<String>) -> Self {
        let context = &prompt[prompt.len().saturating_sub(CONTEXT_TOKENS)..];
        Self {
            tokenizer,
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
            text: String::new(),
            released: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            stopped: false,
        }
    }

    /// The tokenizer it decodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn decode(&self, ids: &[u32]) -> Result<String, DetokError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| DetokError(e.to_string()))
    }

    /// Append the text the window gained, if it is final; `last`: take it even when it ends
    /// inside a character (the generation ended there).
    fn advance(&mut self, last: bool) -> Result<(), DetokError> {
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        if full.len() <= prefix.len() || (!last && full.ends_with('\u{FFFD}')) {
            return Ok(());
        }
        let new = match full.strip_prefix(prefix.as_str()) {
            Some(new) => new,
            // A decoder that rewrote the prefix (space clean-up): take the bytes past it.
            None => full.get(prefix.len()..).unwrap_or(""),
        };
        self.text.push_str(new);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(())
    }

    /// Cut the text before the first stop string in the unreleased part; `true` if one was.
    fn find_stop(&mut self) -> bool {
        let pending = &self.text[self.released..];
        let hit = self
            .stops
            .iter()
            .filter_map(|s| pending.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            self.text.truncate(self.released + at);
            self.stopped = true;
        }
        self.stopped
    }

    /// Add one generated token; `Ok(true)` when the text now contains a stop string (the
    /// request should end: nothing after it is ever released).
    pub fn push(&mut self, id: u32) -> Result<bool, DetokError> {
        if self.stopped {
            return Ok(true);
        }
        self.ids.push(id);
        self.advance(false)?;
        Ok(self.find_stop())
    }

    /// Whether a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Text that is now final: everything not yet released except a tail that could still
    /// become a stop string (all of it once a stop string matched).
    pub fn ready(&mut self) -> String {
        let pending = &self.text[self.released..];
        let hold = if self.stopped {
            0
        } else {
            self.stops
                .iter()
                .filter_map(|s| {
                    (1..s.len().min(pending.len() + 1))
                        .rev()
                        .find(|&k| s.is_char_boundary(k) && pending.ends_with(&s[..k]))
                })
                .max()
                .unwrap_or(0)
        };
        let end = self.text.len() - hold;
        let out = self.text[self.released..end].to_string();
        self.released = end;
        out
    }

    /// The generation ended (not by a stop string): decode what is left, even a character cut
    /// in half (as a full decode would show it), and release everything up to any stop string;
    /// `true` when a stop string matched in that last piece.
    pub fn finish(&mut self) -> Result<(String, bool), DetokError> {
        let mut hit = false;
        if !self.stopped && self.read_offset < self.ids.len() {
            self.advance(true)?;
            hit = self.find_stop();
        }
        self.stopped = true;
        Ok((self.ready(), hit))
    }

    /// All text released so far (and held back), for tests.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tokenizer() -> Arc<Tokenizer> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../python/dspark/models/tiny/target/tokenizer.json");
        Arc::new(Tokenizer::from_file(path).unwrap())
    }

    fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).unwrap().get_ids().to_vec()
    }

    /// Stream `ids` through a detokenizer; the released pieces, and whether a stop hit.
    fn stream(tok: &Arc<Tokenizer>, ids: &[u32], stops: &[&str]) -> (Vec<String>, bool) {
        let mut d = Detokenizer::new(
            Arc::clone(tok),
            &[],
            stops.iter().map(|s| s.to_string()).collect(),
        );
        let mut pieces = Vec::new();
        for &id in ids {
            let stop = d.push(id).unwrap();
            pieces.push(d.ready());
            if stop {
                return (pieces, true);
            }
        }
        pieces.push(d.finish().unwrap().0);
        (pieces, false)
    }

    #[test]
    fn pieces_join_to_the_full_decode() {
        let tok = tokenizer();
        let text = "def f(x):\n    return x * 2  # naïve — 日本語 ✓ 🎉\n\tprint('ok')\n";
        let ids = encode(&tok, text);
        let (pieces, stopped) = stream(&tok, &ids, &[]);
        assert!(!stopped);
        assert_eq!(pieces.concat(), tok.decode(&ids, true).unwrap());
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    }

    #[test]
    fn split_characters_are_held_until_complete() {
        let tok = tokenizer();
        // Byte-level ids of one 4-byte character, one token per byte where the vocabulary
        // has no merge for it.
        let ids = encode(&tok, "🎉");
        let (pieces, _) = stream(&tok, &ids, &[]);
        assert_eq!(pieces.concat(), "🎉");
        assert!(pieces.iter().all(|p| p.is_empty() || p == "🎉"));
    }

    #[test]
    fn a_cut_character_shows_at_the_end_as_a_full_decode_does() {
        let tok = tokenizer();
        let ids = encode(&tok, "a🎉");
        if ids.len() > 2 {
            let cut = &ids[..ids.len() - 1];
            let (pieces, _) = stream(&tok, cut, &[]);
            assert_eq!(pieces.concat(), tok.decode(cut, true).unwrap());
        }
    }

    #[test]
    fn stop_strings_cut_before_the_match_across_tokens() {
        let tok = tokenizer();
        let text = "alpha beta gamma delta epsilon";
        let ids = encode(&tok, text);
        for (stop, expect) in [
            ("gamma", "alpha beta "),
            ("a g", "alpha bet"),
            ("lta eps", "alpha beta gamma de"),
            ("alpha", ""),
            ("zeta", text),
        ] {
            let (pieces, stopped) = stream(&tok, &ids, &[stop]);
            assert_eq!(pieces.concat(), expect, "stop {stop:?}");
            assert_eq!(stopped, stop != "zeta");
            // Nothing released ever contains (or, joined, ever contained) the stop string.
            assert!(!pieces.concat().contains(stop) || stop == "zeta");
        }
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let tok = tokenizer();
        let ids = encode(&tok, "one two three four");
        let (pieces, stopped) = stream(&tok, &ids, &["four", "two", "three"]);
        assert!(stopped);
        assert_eq!(pieces.concat(), "one ");
    }

    #[test]
    fn a_possible_stop_prefix_is_held_then_released() {
        let tok = tokenizer();
        let mut d = Detokenizer::new(Arc::clone(&tok), &[], vec!["STOP".into()]);
        let mut out = String::new();
        for id in encode(&tok, "x ST") {
            d.push(id).unwrap();
            out.push_str(&d.ready());
        }
        assert!(!out.ends_with("ST"), "{out:?}");
        for id in encode(&tok, "ART") {
            assert!(!d.push(id).unwrap());
            out.push_str(&d.ready());
        }
        out.push_str(&d.finish().unwrap().0);
        assert_eq!(out, "x START");
    }

    #[test]
    fn special_tokens_are_skipped() {
        let tok = tokenizer();
        let eos = tok.token_to_id("<|endoftext|>").unwrap();
        let mut ids = encode(&tok, "hi");
        ids.push(eos);
        let (pieces, _) = stream(&tok, &ids, &[]);
        assert_eq!(pieces.concat(), "hi");
    }

    #[test]
    fn prompt_context_does_not_leak_into_the_output() {
        let tok = tokenizer();
        let prompt = encode(&tok, "print(\"héllo");
        let out = encode(&tok, " wörld\")");
        let mut d = Detokenizer::new(Arc::clone(&tok), &prompt, vec![]);
        let mut text = String::new();
        for &id in &out {
            d.push(id).unwrap();
            text.push_str(&d.ready());
        }
        text.push_str(&d.finish().unwrap().0);
        assert_eq!(text, tok.decode(&out, true).unwrap());
    }
}
