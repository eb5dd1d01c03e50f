//! Guided blocks (`ProposeOptions::guides`): every slot of a guided row is one its guide
//! allows, drawn from the drafter's distribution restricted to the allowed ones after the slots
//! before it (greedy: its argmax there), so a guide that allows the even ids drafts what a huge
//! negative bias on the odd ids drafts, and reports `-inf` there; unguided rows and a guide
//! that allows everything change nothing.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::drafter_common::{Tiny, context, load};
use dspark::sampling::Seeds;
use dspark::{
    BlockGuide, DraftState, Drafter, Guide, InBlockPenalty, ProposeOptions, Qwen3Drafter,
};

/// Allows the ids `id % modulus == 0` below `vocab`; counts its full sets.
pub struct Multiples {
    pub modulus: u32,
    pub vocab: usize,
    pub sets: Arc<AtomicUsize>,
}

impl BlockGuide for Multiples {
    fn accepts(&self, tokens: &[u32]) -> usize {
        tokens
            .iter()
            .take_while(|&&t| t.is_multiple_of(self.modulus))
            .count()
    }

    fn allowed_after(&self, tokens: &[u32]) -> Option<Vec<u32>> {
        assert_eq!(
            self.accepts(tokens),
            tokens.len(),
            "asked after a refused token"
        );
        self.sets.fetch_add(1, Ordering::Relaxed);
        let mut mask = vec![0u32; self.vocab.div_ceil(32)];
        for t in (0..self.vocab).filter(|&t| (t as u32).is_multiple_of(self.modulus)) {
            mask[t / 32] |= 1 << (t % 32);
        }
        Some(mask)
    }
}

/// A guide that refuses everything and cannot say what it allows.
struct Mute;

impl BlockGuide for Mute {
    fn accepts(&self, _: &[u32]) -> usize {
        0
    }

    fn allowed_after(&self, _: &[u32]) -> Option<Vec<u32>> {
        None
    }
}

pub fn multiples(modulus: u32, vocab: usize) -> (Guide, Arc<AtomicUsize>) {
    let sets = Arc::new(AtomicUsize::new(0));
    let g = Multiples {
        modulus,
        vocab,
        sets: sets.clone(),
    };
    (Guide::new(g), sets)
}

/// Three rows of cached context.
fn states(d: &Qwen3Drafter) -> Vec<DraftState> {
    let ctx = context(41, 3, 6);
    (0..3)
        .map(|j| {
            let mut s = d.new_state().unwrap();
            d.extend(&mut s, &ctx.get(j).unwrap(), 0).unwrap();
            s
        })
        .collect()
}

/// A tiny drafter, three rows of cached context, their anchors and the target vocabulary.
fn setup() -> (
    tempfile::TempDir,
    Qwen3Drafter,
    Vec<DraftState>,
    [u32; 3],
    usize,
) {
    let tiny = Tiny::default();
    let (dir, d) = load(&tiny);
    let s = states(&d);
    (dir, d, s, [2, 7, 4], tiny.target_vocab)
}

/// The odd (non-multiple) ids pushed far below everything for rows 0 and 2.
fn ban(modulus: u32, vocab: usize) -> Vec<Vec<(u32, f32)>> {
    let row: Vec<(u32, f32)> = (0..vocab as u32)
        .filter(|t| t % modulus != 0)
        .map(|t| (t, -1e4))
        .collect();
    vec![row.clone(), Vec::new(), row]
}

#[test]
fn guided_rows_draft_from_the_drafter_restricted_to_the_allowed_ones() {
    let (_dir, d, s, anchors, v) = setup();
    let refs: Vec<_> = s.iter().collect();
    // Greedy alone (one pass, refused rows drawn again), greedy and sampled under in-block
    // penalties (slot by slot: the same streams as the banned block's).
    for (modulus, pens, temperature) in [
        (2, false, 0.0),
        (3, false, 0.0),
        (2, true, 0.0),
        (2, true, 0.9),
        (3, true, 0.7),
    ] {
        let in_block = pens.then(|| {
            vec![
                InBlockPenalty {
                    presence: 0.5,
                    frequency: 1.5,
                    seen: vec![4],
                };
                3
            ]
        });
        let plain = ProposeOptions {
            in_block: in_block.clone(),
            temperature,
            seeds: Seeds::PerRequest(vec![21, 22, 23]),
            ..ProposeOptions::default()
        };
        let free = d.propose_cached(&refs, &anchors, &plain).unwrap();
        let (g, sets) = multiples(modulus, v);
        let guided = ProposeOptions {
            guides: Some(vec![Some(g.clone()), None, Some(g)]),
            ..plain.clone()
        };
        let a = d.propose_cached(&refs, &anchors, &guided).unwrap();
        let banned = ProposeOptions {
            logit_bias: Some(ban(modulus, v)),
            ..plain.clone()
        };
        let b = d.propose_cached(&refs, &anchors, &banned).unwrap();
        let case = format!("modulus {modulus}, penalties {pens}, T {temperature}");
        let k = a.slots;
        assert_eq!(a.tokens, b.tokens, "{case}");
        assert_eq!(a.confidence, b.confidence, "{case}");
        // The reported distributions: the banned block's, with the refused ids at -inf (a
        // greedy slot reports its token alone).
        for (i, (x, y)) in a.draft_logits.iter().zip(&b.draft_logits).enumerate() {
            let (row, t) = (i / (k * v), (i % v) as u32);
            if row != 1 && t % modulus != 0 {
                assert_eq!(*x, f32::NEG_INFINITY, "{case}: entry {i}");
            } else {
                assert_eq!(x, y, "{case}: entry {i}");
            }
        }
        // The unguided row is the unguided block's.
        assert_eq!(a.tokens[k..2 * k], free.tokens[k..2 * k], "{case}");
        assert!(
            a.tokens[..k]
                .iter()
                .chain(&a.tokens[2 * k..])
                .all(|t| t % modulus == 0),
            "{case}: {:?}",
            a.tokens
        );
        // The test means something: the free block left the guide, and full sets were asked
        // only where it did (greedy) or once per guided slot (sampled).
        let refused = [0, 2].iter().any(|&r| {
            free.tokens[r * k..(r + 1) * k]
                .iter()
                .any(|t| t % modulus != 0)
        });
        assert!(refused, "{case}: {:?}", free.tokens);
        assert!(sets.load(Ordering::Relaxed) <= 2 * k, "{case}");
    }
}

#[test]
fn guides_that_allow_everything_or_cannot_say_change_nothing() {
    let (_dir, d, s, anchors, v) = setup();
    let refs: Vec<_> = s.iter().collect();
    let pens = vec![
        InBlockPenalty {
            presence: 0.25,
            frequency: 0.0,
            seen: vec![],
        };
        3
    ];
    // Greedy (one pass), and sampled under in-block penalties (slot by slot either way).
    for (temperature, in_block) in [(0.0, None), (0.9, Some(pens))] {
        let plain = ProposeOptions {
            temperature,
            in_block,
            seeds: Seeds::PerRequest(vec![3, 4, 5]),
            ..ProposeOptions::default()
        };
        let free = d.propose_cached(&refs, &anchors, &plain).unwrap();
        let (all, sets) = multiples(1, v);
        let guided = ProposeOptions {
            guides: Some(vec![Some(all), Some(Guide::new(Mute)), None]),
            ..plain.clone()
        };
        let a = d.propose_cached(&refs, &anchors, &guided).unwrap();
        assert_eq!(a.tokens, free.tokens, "T {temperature}");
        assert_eq!(a.draft_logits, free.draft_logits);
        assert_eq!(a.confidence, free.confidence);
        let asked = sets.load(Ordering::Relaxed);
        if temperature == 0.0 {
            assert_eq!(asked, 0, "a greedy block the guide allows asks for no set");
        } else {
            assert_eq!(asked, a.slots, "a sampled block asks once per slot");
        }
    }
}

/// A request that follows nothing drafts the same block whether or not another request of
/// its call follows a guide or in-block penalties (those are drawn slot by slot, it in one
/// pass as in a plain call): its drafts depend on its seed and position alone.
#[test]
fn a_plain_row_drafts_the_same_beside_guided_or_penalized_ones() {
    let (_dir, d, s, anchors, v) = setup();
    let refs: Vec<_> = s.iter().collect();
    let pen = InBlockPenalty {
        presence: 0.5,
        frequency: 1.0,
        seen: vec![],
    };
    for temperature in [0.9, 0.0] {
        let plain = ProposeOptions {
            temperature,
            seeds: Seeds::PerRequest(vec![31, 32, 33]),
            ..ProposeOptions::default()
        };
        let free = d.propose_cached(&refs, &anchors, &plain).unwrap();
        let (g, _) = multiples(2, v);
        let mixes = [
            (Some(vec![Some(g.clone()), None, None]), None),
            (
                None,
                Some(vec![pen.clone(), InBlockPenalty::default(), pen.clone()]),
            ),
            (Some(vec![None, None, Some(g)]), Some(vec![pen.clone(); 3])),
        ];
        for (i, (guides, in_block)) in mixes.into_iter().enumerate() {
            let all_follow = in_block
                .as_ref()
                .is_some_and(|p| p.iter().all(|p| p.is_active()));
            let opts = ProposeOptions {
                guides,
                in_block,
                ..plain.clone()
            };
            let mixed = d.propose_cached(&refs, &anchors, &opts).unwrap();
            if all_follow {
                continue; // every row follows something: nothing is plain
            }
            let (k, vt) = (mixed.slots, mixed.target_vocab);
            let case = format!("T {temperature}, mix {i}");
            assert_eq!(mixed.tokens[k..2 * k], free.tokens[k..2 * k], "{case}");
            assert_eq!(
                mixed.draft_logits[k * vt..2 * k * vt],
                free.draft_logits[k * vt..2 * k * vt],
                "{case}"
            );
            let conf = |p: &dspark::Proposal| p.confidence.as_ref().map(|c| c[k..2 * k].to_vec());
            assert_eq!(conf(&mixed), conf(&free), "{case}");
        }
    }
}
