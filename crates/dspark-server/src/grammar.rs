//! Structured output for the server: `response_format` (and the `regex` / `grammar`
//! extensions) compiled by llguidance into a [`TokenConstraint`] over the target vocabulary.
//!
//! The token trie is built once per model from `tokenizer.json` (each token's bytes; special
//! tokens marked so that no grammar emits them by accident); every request compiles its own
//! grammar into a matcher. A grammar that completes allows the end-of-sequence token alone, so
//! the request stops there; one that dead-ends (an error inside the matcher) does the same,
//! with a warning in the log.

use std::sync::Arc;

use dspark::engine::TokenConstraint;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// The compiler of a model's grammars.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.vocab)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// From the model's `tokenizer.json` (parsed), its vocabulary of `vocab` ids (ids past the
    /// tokenizer's are padding no grammar allows) and its end-of-sequence id. Errors say why
    /// structured output is unavailable (a tokenizer whose token bytes cannot be read).
    pub fn new(tokenizer_json: &Value, vocab: usize, eos: u32) -> Result<Self, String> {
        let mut words = llguidance::token_bytes_from_tokenizer_json(tokenizer_json)
            .map_err(|e| format!("the tokenizer's token bytes cannot be read: {e}"))?;
        if words.len() > vocab {
            return Err(format!(
                "the tokenizer has {} tokens, the model's vocabulary {vocab}",
                words.len()
            ));
        }
        for i in words.len()..vocab {
            // A special-marked name: never matched by text.
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            w.extend_from_slice(format!("<|dspark_pad_{i}|>").as_bytes());
            words.push(w);
        }
        let info = TokRxInfo::new(vocab as u32, eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self {
            factory,
            vocab,
            eos,
        })
    }

    /// A request's constraint: `grammar` compiled (errors: the compiler's message).
    pub fn compile(&self, grammar: TopLevelGrammar) -> Result<Guided, String> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        // A grammar that can never match (an empty language) is refused here, not run.
        let first = matcher.compute_mask().map_err(|e| e.to_string())?;
        if first.is_zero() && !matcher.is_accepting().unwrap_or(false) {
            return Err("the grammar matches no text".into());
        }
        Ok(Guided {
            matcher,
            words: self.vocab.div_ceil(32),
            eos: self.eos,
            past_end: 0,
        })
    }
}

/// One request's grammar state.
///
/// The end-of-sequence token and whatever follows it (a request with `ignore_eos`, or drafts
/// checked past the end) are counted here, not fed to the matcher: a matcher that consumed it
/// has stopped, and rolling a stopped matcher back does not restore its state, while the
/// engine consumes drafts and rolls them back every round.
pub struct Guided {
    matcher: Matcher,
    words: usize,
    eos: u32,
    /// Tokens consumed from the end-of-sequence token on.
    past_end: usize,
}

impl Guided {
    fn eos_only(&self) -> Vec<u32> {
        let mut mask = vec![0u32; self.words];
        if let Some(w) = mask.get_mut(self.eos as usize / 32) {
            *w |= 1 << (self.eos % 32);
        }
        mask
    }
}

impl TokenConstraint for Guided {
    fn allowed(&mut self) -> Result<Vec<u32>, String> {
        if self.past_end > 0 {
            return Ok(self.eos_only());
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(v) => {
                let mut mask = v.as_slice().to_vec();
                mask.resize(self.words, 0);
                Ok(mask)
            }
            Err(e) => {
                tracing::warn!("the grammar dead-ends ({e}): the request stops here");
                Ok(self.eos_only())
            }
        }
    }

    fn validate(&mut self, tokens: &[u32]) -> usize {
        if self.past_end > 0 {
            // Past the end only the end-of-sequence token is allowed (as `allowed` says).
            return tokens.iter().take_while(|&&t| t == self.eos).count();
        }
        let n = self.matcher.validate_tokens(tokens).unwrap_or(0);
        // The matcher's check refuses the end-of-sequence token that its mask allows once the
        // grammar accepts (`compute_mask_or_eos`): count it, as `allowed` does.
        if tokens.get(n) != Some(&self.eos) {
            return n;
        }
        let accepts = if n == 0 {
            self.matcher.is_accepting().unwrap_or(false)
        } else if self.matcher.consume_tokens(&tokens[..n]).is_ok() {
            let a = self.matcher.is_accepting().unwrap_or(false);
            if self.matcher.rollback(n).is_err() {
                return n;
            }
            a
        } else {
            false
        };
        n + usize::from(accepts)
    }

    fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
        if self.past_end > 0 || self.matcher.is_stopped() {
            self.past_end += tokens.len();
            return Ok(());
        }
        let end = tokens
            .iter()
            .position(|&t| t == self.eos)
            .unwrap_or(tokens.len());
        if end > 0 {
            self.matcher
                .consume_tokens(&tokens[..end])
                .map_err(|e| e.to_string())?;
        }
        if end < tokens.len() {
            if !self.matcher.is_accepting().unwrap_or(false) {
                self.matcher.rollback(end).map_err(|e| e.to_string())?;
                return Err("the end-of-sequence token before the grammar is complete".into());
            }
            self.past_end = tokens.len() - end;
        }
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> Result<(), String> {
        let past = n.min(self.past_end);
        self.past_end -= past;
        if n > past {
            self.matcher.rollback(n - past).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The bytes the grammar forces, tokenized greedily over the trie (llguidance's own
    /// fast-forward tokens need a canonical tokenizer, which an approximate environment is
    /// not), without the last token (the text after it could merge with its bytes).
    fn forced(&mut self) -> Vec<u32> {
        if self.past_end > 0 || self.matcher.is_stopped() {
            return Vec::new();
        }
        let bytes = self.matcher.compute_ff_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        let Ok(env) = self.matcher.tok_env() else {
            return Vec::new();
        };
        let mut tokens = env.tok_trie().greedy_tokenize(&bytes);
        tokens.pop();
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprobs::Pieces;

    fn bundled() -> (tokenizers::Tokenizer, Grammars) {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../python/dspark/models/tiny/target/tokenizer.json");
        let bytes = std::fs::read(&path).unwrap();
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).unwrap();
        // The bundled target's vocabulary is 3000 ids, its end-of-sequence id 0.
        (tok, Grammars::new(&json, 3000, 0).unwrap())
    }

    fn allowed_ids(mask: &[u32]) -> Vec<u32> {
        (0..mask.len() as u32 * 32)
            .filter(|&v| mask[v as usize / 32] >> (v % 32) & 1 == 1)
            .collect()
    }

    #[test]
    fn a_regex_walk_stays_in_the_language_and_ends_with_eos() {
        let (tok, g) = bundled();
        let pieces = Pieces::new(&tok);
        let mut c = g.compile(TopLevelGrammar::from_regex("[0-9]{4}")).unwrap();
        let mut text = Vec::new();
        for _ in 0..8 {
            let ids = allowed_ids(&c.allowed().unwrap());
            assert!(!ids.is_empty());
            if ids == [0] {
                break; // the language is complete: end-of-sequence alone
            }
            let t = *ids.iter().find(|&&t| t != 0).unwrap();
            for &id in &ids {
                let b = pieces.piece(&tok, id).bytes;
                assert!(id == 0 || b.iter().all(u8::is_ascii_digit), "{b:?}");
            }
            assert_eq!(c.validate(&[t]), 1);
            c.consume(&[t]).unwrap();
            text.extend(pieces.piece(&tok, t).bytes);
        }
        assert_eq!(text.len(), 4, "{:?}", String::from_utf8_lossy(&text));
        // Rolling back re-opens the language.
        c.rollback(1).unwrap();
        assert!(allowed_ids(&c.allowed().unwrap()).iter().any(|&t| t != 0));
        // A token outside the language is refused.
        let letter = tok.encode("x", false).unwrap().get_ids()[0];
        assert_eq!(c.validate(&[letter]), 0);
    }

    /// The engine's lazy rows check the target's greedy token with `validate` and compute the
    /// full set only when it is refused: the two must agree on every token, in every state (a
    /// JSON schema's walk, its end included).
    #[test]
    fn the_one_token_check_agrees_with_the_allowed_set() {
        let (tok, g) = bundled();
        let schema = serde_json::json!({"type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
            "required": ["a", "b"]});
        let mut c = g
            .compile(TopLevelGrammar::from_json_schema(schema))
            .unwrap();
        let text = r#"{"a": 12, "b": "xy"}"#;
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let mut checked = 0;
        let mut forced_any = false;
        for step in 0..=ids.len() {
            // What the grammar forces from here is in the grammar, and asking leaves the state
            // as it was (the checks below run after it).
            let forced = c.forced();
            assert_eq!(
                c.validate(&forced),
                forced.len(),
                "{forced:?} after {step} tokens"
            );
            forced_any |= !forced.is_empty();
            let mask = c.allowed().unwrap();
            for t in 0..3000u32 {
                let allowed = mask[t as usize / 32] >> (t % 32) & 1 == 1;
                assert_eq!(
                    c.validate(&[t]) == 1,
                    allowed,
                    "token {t} after {step} tokens"
                );
            }
            checked += 1;
            match ids.get(step) {
                Some(&t) if c.validate(&[t]) == 1 => c.consume(&[t]).unwrap(),
                _ => break,
            }
        }
        assert!(checked > 3, "the walk went {checked} steps");
        assert!(forced_any, "a JSON schema forces some text");
        // Forced text after a rollback is the same, and so is the mask.
        c.rollback(checked - 1).unwrap();
        let (mask, forced) = (c.allowed().unwrap(), c.forced());
        c.consume(&ids[..2]).unwrap();
        let _ = c.forced();
        c.rollback(2).unwrap();
        assert_eq!((c.allowed().unwrap(), c.forced()), (mask, forced));
    }

    /// The engine consumes drafts and rolls them back every round, the end-of-sequence token
    /// and tokens after it included: the state after the rollback is the state before.
    #[test]
    fn consuming_past_the_end_rolls_back_to_the_same_state() {
        let (tok, g) = bundled();
        let mut c = g.compile(TopLevelGrammar::from_regex("ab")).unwrap();
        let text = tok.encode("ab", false).unwrap().get_ids().to_vec();
        let letter = tok.encode("x", false).unwrap().get_ids()[0];
        c.consume(&text).unwrap();
        let before = (c.allowed().unwrap(), c.validate(&[0]), c.forced());
        assert_eq!(
            allowed_ids(&before.0),
            [0],
            "complete: end-of-sequence alone"
        );
        assert_eq!(before.1, 1);
        for tail in [vec![0], vec![0, letter], vec![0, 0, letter]] {
            c.consume(&tail).unwrap();
            assert_eq!(allowed_ids(&c.allowed().unwrap()), [0]);
            assert_eq!(c.validate(&[0, letter]), 1);
            c.rollback(tail.len()).unwrap();
            assert_eq!((c.allowed().unwrap(), c.validate(&[0]), c.forced()), before);
        }
        // Back into the text, and forward again.
        c.consume(&[0]).unwrap();
        c.rollback(1 + text.len()).unwrap();
        assert!(allowed_ids(&c.allowed().unwrap()).iter().all(|&t| t != 0));
        c.consume(&text).unwrap();
        assert_eq!(c.allowed().unwrap(), before.0);
        // The end before the text is complete is refused, and changes nothing.
        let mut d = g.compile(TopLevelGrammar::from_regex("abc")).unwrap();
        let start = d.allowed().unwrap();
        assert!(d.consume(&[0]).is_err());
        assert_eq!(d.allowed().unwrap(), start);
    }

    #[test]
    fn bad_grammars_are_refused_at_compile_time() {
        let (_, g) = bundled();
        assert!(g.compile(TopLevelGrammar::from_regex("a(")).is_err());
        assert!(
            g.compile(TopLevelGrammar::from_lark("start: foo".into()))
                .is_err()
        );
        assert!(
            g.compile(TopLevelGrammar::from_json_schema(
                serde_json::json!({"type": "nonsense"})
            ))
            .is_err()
        );
        let ok = g.compile(TopLevelGrammar::from_json_schema(
            serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}},
                               "required": ["a"]}),
        ));
        assert!(ok.is_ok());
    }
}
