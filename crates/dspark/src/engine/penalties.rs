//! A request's changes to the target distribution: presence, frequency and repetition
//! penalties and a logit bias ([`Penalties`]), and the edit they make to one logits row.
//!
//! At every position the target's logits are changed from the tokens before it: presence and
//! frequency count the request's generated tokens (drafts verified before the position
//! included), repetition looks at the prompt and the generated tokens (vLLM's rule: a positive
//! logit is divided by the penalty, a negative one multiplied), and the bias is added last.
//! Verification then runs against the changed rows, so speculative output follows the changed
//! distribution exactly; the drafter's `q` is left as it drew from (exact for any `q`).

use std::collections::HashMap;

use crate::drafter::InBlockPenalty;
use crate::error::{Error, Result};

/// Most `logit_bias` entries a request may carry.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// How a request changes the target distribution; the default changes nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Penalties {
    /// Subtracted once from the logit of every token generated at least once; in `[-2, 2]`.
    pub presence: f32,
    /// Subtracted from a token's logit once per time it was generated; in `[-2, 2]`.
    pub frequency: f32,
    /// Divides a positive logit (multiplies a negative one) of a token in the prompt or
    /// generated; finite and `> 0` (`1`: off).
    pub repetition: f32,
    /// Added to the logit of each listed token (ids below the target vocabulary, values in
    /// `[-100, 100]`; at most [`MAX_LOGIT_BIAS`]).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Self {
            presence: 0.0,
            frequency: 0.0,
            repetition: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

impl Penalties {
    /// Whether it changes any logit.
    pub fn is_active(&self) -> bool {
        self.presence != 0.0
            || self.frequency != 0.0
            || self.repetition != 1.0
            || !self.logit_bias.is_empty()
    }

    /// Check the values against a vocabulary of `vocab` ids; errors name `what` and the field.
    pub fn check(&self, what: &str, vocab: usize) -> Result<()> {
        for (field, v) in [
            ("presence_penalty", self.presence),
            ("frequency_penalty", self.frequency),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(Error::invalid(
                    format!("{what}.{field}"),
                    format!("{v}: must be in [-2, 2]"),
                ));
            }
        }
        let r = self.repetition;
        if !(r.is_finite() && r > 0.0) {
            return Err(Error::invalid(
                format!("{what}.repetition_penalty"),
                format!("{r}: must be finite and > 0"),
            ));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(Error::invalid(
                format!("{what}.logit_bias"),
                format!(
                    "{} entries: at most {MAX_LOGIT_BIAS}",
                    self.logit_bias.len()
                ),
            ));
        }
        let mut ids: Vec<u32> = self.logit_bias.iter().map(|e| e.0).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(
                format!("{what}.logit_bias"),
                format!("token {} is listed twice", w[0]),
            ));
        }
        for &(id, b) in &self.logit_bias {
            if id as usize >= vocab {
                return Err(Error::TokenOutOfRange {
                    name: format!("{what}.logit_bias"),
                    id: i64::from(id),
                    vocab_size: vocab,
                });
            }
            if !(-100.0..=100.0).contains(&b) {
                return Err(Error::invalid(
                    format!("{what}.logit_bias"),
                    format!("token {id}: bias {b} must be in [-100, 100]"),
                ));
            }
        }
        Ok(())
    }
}

/// The tokens one row's edit depends on: how often each was generated before the position,
/// and the prompt (for the repetition penalty).
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    counts: HashMap<u32, u32>,
}

impl History {
    /// The counts of `generated`.
    pub(crate) fn of(generated: &[u32]) -> Self {
        let mut h = Self::default();
        for &t in generated {
            h.push(t);
        }
        h
    }

    /// One more generated token.
    pub(crate) fn push(&mut self, t: u32) {
        *self.counts.entry(t).or_insert(0) += 1;
    }
}

impl Penalties {
    /// The tokens whose logits the edit of a row with `history` (and `prompt`) touches, each
    /// once, in a fixed order.
    pub(crate) fn touched(&self, history: &History, prompt: &[u32]) -> Vec<u32> {
        let mut ids: Vec<u32> = Vec::new();
        if self.presence != 0.0 || self.frequency != 0.0 || self.repetition != 1.0 {
            ids.extend(history.counts.keys().copied());
        }
        if self.repetition != 1.0 {
            ids.extend_from_slice(prompt);
        }
        ids.extend(self.logit_bias.iter().map(|&(id, _)| id));
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The same penalties with the bias sorted by id (what [`Penalties::edit`] looks up).
    pub(crate) fn sorted(mut self) -> Self {
        self.logit_bias.sort_unstable_by_key(|e| e.0);
        self
    }

    /// What the drafter adds to its base logits for a request that generated `generated`:
    /// the presence and frequency penalties of those tokens and the bias, by target id (the
    /// additive part of the change; the repetition penalty scales the target's own logits and
    /// is left to verification). Empty when there is nothing to add.
    pub(crate) fn draft_bias(&self, generated: &[u32]) -> Vec<(u32, f32)> {
        let mut add: HashMap<u32, f32> = HashMap::new();
        if self.presence != 0.0 || self.frequency != 0.0 {
            for (&t, &c) in &History::of(generated).counts {
                *add.entry(t).or_insert(0.0) -= self.presence + self.frequency * c as f32;
            }
        }
        for &(t, b) in &self.logit_bias {
            *add.entry(t).or_insert(0.0) += b;
        }
        let mut out: Vec<(u32, f32)> = add.into_iter().filter(|e| e.1 != 0.0).collect();
        out.sort_unstable_by_key(|e| e.0);
        out
    }

    /// The presence and frequency penalties the drafter applies inside a block, after
    /// `generated` (the repetition penalty and the bias do not depend on the drafts before a
    /// slot beyond what [`Penalties::draft_bias`] gives, or are left to verification).
    pub(crate) fn in_block(&self, generated: &[u32]) -> InBlockPenalty {
        if self.presence == 0.0 && self.frequency == 0.0 {
            return InBlockPenalty::default();
        }
        let mut seen = generated.to_vec();
        seen.sort_unstable();
        seen.dedup();
        InBlockPenalty {
            presence: self.presence,
            frequency: self.frequency,
            seen,
        }
    }

    /// Token `id`'s new logit from `x`, after `history` (and `prompt`, whose membership the
    /// caller gives as `in_prompt`). The bias must be [`sorted`](Penalties::sorted).
    pub(crate) fn edit(&self, id: u32, x: f32, history: &History, in_prompt: bool) -> f32 {
        let count = history.counts.get(&id).copied().unwrap_or(0);
        let mut y = x;
        if self.repetition != 1.0 && (count > 0 || in_prompt) && y.is_finite() {
            y = if y > 0.0 {
                y / self.repetition
            } else {
                y * self.repetition
            };
        }
        if count > 0 {
            y -= self.presence + self.frequency * count as f32;
        }
        if let Ok(k) = self.logit_bias.binary_search_by_key(&id, |e| e.0) {
            y += self.logit_bias[k].1;
        }
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edit_follows_the_openai_and_vllm_rules() {
        let p = Penalties {
            presence: 0.5,
            frequency: 0.25,
            repetition: 2.0,
            logit_bias: vec![(9, 3.0), (1, -1.0)],
        }
        .sorted();
        let h = History::of(&[4, 4, 7]);
        // Generated twice: repetition halves the positive logit, then 0.5 + 2 * 0.25.
        assert_eq!(p.edit(4, 3.0, &h, false), 1.5 - 1.0);
        // Negative logits are multiplied.
        assert_eq!(p.edit(7, -1.0, &h, false), -2.0 - 0.75);
        // Prompt only: repetition, no presence or frequency.
        assert_eq!(p.edit(5, 4.0, &h, true), 2.0);
        // Untouched tokens keep their logit; the bias is added.
        assert_eq!(p.edit(6, 1.0, &h, false), 1.0);
        assert_eq!(p.edit(9, 1.0, &h, false), 4.0);
        // A masked logit stays masked.
        assert_eq!(p.edit(4, f32::NEG_INFINITY, &h, false), f32::NEG_INFINITY);
        assert_eq!(p.touched(&h, &[5, 4]), vec![1, 4, 5, 7, 9]);
        assert!(!Penalties::default().is_active());
    }

    #[test]
    fn bad_values_are_typed_errors_naming_the_field() {
        let bad = |p: Penalties| p.check("request 0", 10).unwrap_err().to_string();
        let base = Penalties::default();
        for (p, field) in [
            (
                Penalties {
                    presence: 2.5,
                    ..base.clone()
                },
                "presence_penalty",
            ),
            (
                Penalties {
                    frequency: f32::NAN,
                    ..base.clone()
                },
                "frequency_penalty",
            ),
            (
                Penalties {
                    repetition: 0.0,
                    ..base.clone()
                },
                "repetition_penalty",
            ),
            (
                Penalties {
                    logit_bias: vec![(10, 1.0)],
                    ..base.clone()
                },
                "logit_bias",
            ),
            (
                Penalties {
                    logit_bias: vec![(1, 101.0)],
                    ..base.clone()
                },
                "logit_bias",
            ),
            (
                Penalties {
                    logit_bias: vec![(1, 1.0), (2, 1.0), (1, 2.0)],
                    ..base.clone()
                },
                "logit_bias",
            ),
        ] {
            assert!(bad(p).contains(field), "{field}");
        }
        assert!(base.check("r", 10).is_ok());
    }
}
