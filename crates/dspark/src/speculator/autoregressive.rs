//! [`target_only`]: autoregressive decoding without a drafter, the baseline every speculative
//! figure is measured against: the serving engine with a drafter that never drafts.

use candle_core::Tensor;

use super::batch::{check_sampling, run};
use super::options::{Request, SpeculatorOptions};
use super::{Generation, OnRound};
use crate::checkpoint::WeightSource;
use crate::drafter::{Drafter, DrafterInfo, Proposal, ProposeOptions};
use crate::engine::{Budget, Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::models::TargetModel;
use crate::vocab::VocabSizes;

/// A drafter with an empty block: an engine over it decodes with the target alone.
#[derive(Debug)]
pub(crate) struct NoDrafter {
    info: DrafterInfo,
    id_map: IdMap,
}

impl NoDrafter {
    pub(crate) fn new(vocab: usize) -> Result<Self> {
        Ok(Self {
            info: DrafterInfo {
                block_size: 0,
                num_draft_tokens: 0,
                noise_token: 0,
                vocab: VocabSizes::new(vocab, vocab, vocab),
                embed_source: WeightSource::SharedTarget,
                lm_head_source: WeightSource::SharedTarget,
                target_layer_ids: Vec::new(),
                capture_layer_ids: Vec::new(),
                sample_from_anchor: true,
                has_confidence_head: false,
                context_width: 0,
            },
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

    fn info(&self) -> &DrafterInfo {
        &self.info
    }
    fn id_map(&self) -> &IdMap {
        &self.id_map
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
