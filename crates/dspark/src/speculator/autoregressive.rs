//! [`target_only`]: autoregressive decoding without a drafter, the baseline every speculative
//! figure is measured against: the serving engine with a drafter that never drafts.

use candle_core::Tensor;

use super::batch::{check_sampling, run};
use super::options::{Request, SpeculatorOptions};
use super::{Generation, OnRound};
use crate::checkpoint::WeightSource;
use crate::drafter::{Drafter, Proposal, ProposeOptions};
use crate::engine::{Budget, Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::models::TargetModel;
use crate::vocab::VocabSizes;

/// A drafter with an empty block: an engine over it decodes with the target alone.
#[derive(Debug)]
pub(crate) struct NoDrafter {
    vocab: usize,
    id_map: IdMap,
}

impl NoDrafter {
    pub(crate) fn new(vocab: usize) -> Result<Self> {
        Ok(Self {
            vocab,
            id_map: IdMap::identity(vocab)?,
        })
    }
}

fn never() -> Error {
    Error::Internal {
        message: "the target-only engine asked its empty drafter to draft".into(),
    }
}

impl Drafter for NoDrafter {
    type State = ();

    fn block_size(&self) -> usize {
        0
    }
    fn num_draft_tokens(&self) -> usize {
        0
    }
    fn noise_token(&self) -> u32 {
        0
    }
    fn vocab(&self) -> VocabSizes {
        VocabSizes::new(self.vocab, self.vocab, self.vocab)
    }
    fn id_map(&self) -> &IdMap {
        &self.id_map
    }
    fn embed_source(&self) -> WeightSource {
        WeightSource::SharedTarget
    }
    fn lm_head_source(&self) -> WeightSource {
        WeightSource::SharedTarget
    }
    fn target_layer_ids(&self) -> &[i64] {
        &[]
    }
    fn capture_layer_ids(&self) -> &[usize] {
        &[]
    }
    fn sample_from_anchor(&self) -> bool {
        true
    }
    fn has_confidence_head(&self) -> bool {
        false
    }
    fn context_width(&self) -> usize {
        0
    }
    fn new_state(&self) -> Result<()> {
        Ok(())
    }
    fn extend(&self, _: &mut (), _: &Tensor, _: usize) -> Result<()> {
        Ok(())
    }
    fn truncate(&self, _: &mut (), _: usize) -> Result<()> {
        Ok(())
    }
    fn state_end(&self, _: &()) -> usize {
        0
    }
    fn propose_cached(&self, _: &[&()], _: &[u32], _: &ProposeOptions) -> Result<Proposal> {
        Err(never())
    }
    fn propose(&self, _: &Tensor, _: &[u32], _: &[usize], _: &ProposeOptions) -> Result<Proposal> {
        Err(never())
    }
}

/// Autoregressive decoding of `target` alone, on the same seeds and stop rules as
/// [`Speculator::generate`](super::Speculator::generate) (the baseline: greedy output is
/// identical).
pub fn target_only<T: TargetModel>(
    target: &T,
    options: &SpeculatorOptions,
    requests: &[Request],
    on_round: Option<OnRound<'_>>,
) -> Result<Generation> {
    check_sampling(options)?;
    let drafter = NoDrafter::new(target.vocab_size())?;
    let config = EngineConfig {
        budget: Budget {
            max_running: usize::MAX,
            max_batched_tokens: usize::MAX,
            kv_tokens: None,
        },
        ..EngineConfig::default()
    };
    let mut engine = Engine::new_any(target, drafter, config)?;
    run(&mut engine, options, requests, Some(0), on_round)
}
