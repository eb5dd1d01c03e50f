//! Launch plans: what a fused call launches, uploads and downloads, as a pure function of its
//! shapes. The executor ([`super::exec`]) runs exactly these launches, so the budgets the tests
//! check here are the ones a GPU sees.

use super::layout::{
    SB_CHUNK, SB_FILL, SB_MAX_BATCH, THREADS, VF_CHUNK, VF_MAX_BATCH, VF_MAX_STOPS, VfChunk,
    VfResid, VfRow, vf_out_words,
};

/// One kernel launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's entry point.
    pub kernel: &'static str,
    /// Grid dimensions.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub threads: u32,
}

/// The shapes of a verification call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyShape {
    /// `B`.
    pub batch: usize,
    /// `K + 1`.
    pub width: usize,
    /// `V`.
    pub vocab: usize,
    /// Whether draft logits are given.
    pub has_draft: bool,
    /// Whether the draft ids are on the host (they are then uploaded once).
    pub host_tokens: bool,
    /// Number of stop ids.
    pub stops: usize,
}

/// A group of at most [`VF_MAX_BATCH`] requests: one parameter block and four launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// First request.
    pub start: usize,
    /// Requests.
    pub len: usize,
}

impl Group {
    /// `batch` requests in groups of `max` (the last one shorter).
    fn split(batch: usize, max: usize) -> Vec<Group> {
        (0..batch)
            .step_by(max)
            .map(|start| Group {
                start,
                len: max.min(batch - start),
            })
            .collect()
    }
}

/// Byte offsets of the scratch buffers inside one allocation (reused by every group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scratch {
    /// Chunk statistics.
    pub chunks: usize,
    /// Row verdicts.
    pub rows: usize,
    /// Residual sums.
    pub resid: usize,
    /// Output words (every request).
    pub out: usize,
    /// Total bytes.
    pub bytes: usize,
}

/// What a verification call does on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyPlan {
    /// The groups, in order.
    pub groups: Vec<Group>,
    /// Every launch, in order (four per group).
    pub launches: Vec<Launch>,
    /// Host-to-device copies.
    pub uploads: usize,
    /// Device-to-host copies.
    pub downloads: usize,
    /// The scratch layout.
    pub scratch: Scratch,
}

/// Round `x` up to a multiple of 256 bytes.
fn align(x: usize) -> usize {
    x.div_ceil(256) * 256
}

fn u32_of(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// The plan of a verification call.
pub fn verify_plan(shape: VerifyShape) -> VerifyPlan {
    let VerifyShape {
        batch,
        width,
        vocab,
        has_draft,
        host_tokens,
        stops,
    } = shape;
    let k = width.saturating_sub(1);
    let nch = vocab.div_ceil(VF_CHUNK).max(1);
    let groups = Group::split(batch, VF_MAX_BATCH);
    let big = groups.first().map_or(0, |g| g.len);
    let rows_total = |b: usize| b * width + if has_draft { b * k } else { 0 };
    let mut launches = Vec::with_capacity(4 * groups.len());
    for g in &groups {
        let threads = THREADS as u32;
        launches.push(Launch {
            kernel: "dspark_vf_stats",
            grid: (u32_of(nch), u32_of(rows_total(g.len)), 1),
            threads,
        });
        launches.push(Launch {
            kernel: "dspark_vf_rows",
            grid: (u32_of(g.len * width), 1, 1),
            threads,
        });
        launches.push(Launch {
            kernel: "dspark_vf_resid",
            grid: (u32_of(nch), u32_of(g.len), 1),
            threads,
        });
        launches.push(Launch {
            kernel: "dspark_vf_pick",
            grid: (u32_of(g.len), 1, 1),
            threads,
        });
    }
    let chunks = 0;
    let rows = align(chunks + rows_total(big) * nch * size_of::<VfChunk>());
    let resid = align(rows + big * width * size_of::<VfRow>());
    let out = align(resid + big * nch * size_of::<VfResid>());
    let bytes = align(out + batch * vf_out_words(width) * 8);
    VerifyPlan {
        groups,
        launches,
        uploads: usize::from(host_tokens) + usize::from(stops > VF_MAX_STOPS),
        downloads: 1,
        scratch: Scratch {
            chunks,
            rows,
            resid,
            out,
            bytes,
        },
    }
}

/// The shapes of a block-sampler call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    /// `B`.
    pub batch: usize,
    /// `K`.
    pub slots: usize,
    /// `V_t`.
    pub target_vocab: usize,
    /// Draft columns that may be drawn.
    pub valid: usize,
    /// Markov rank.
    pub rank: usize,
    /// Greedy drafting.
    pub greedy: bool,
    /// A d2t table (uploaded once per call).
    pub table: bool,
    /// Top-k candidates.
    pub top_k: Option<usize>,
}

/// Scratch of a block-sampler call (byte offsets in one allocation): what comes back first
/// (tokens, statuses, witnesses: one download), then the working buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockScratch {
    /// `[B, K]` u32 tokens.
    pub tokens: usize,
    /// `[B, K]` u32 statuses.
    pub status: usize,
    /// `[B]` u64 witnesses.
    pub witness: usize,
    /// Bytes of the three above (the download).
    pub result_bytes: usize,
    /// `[B]` u32 previous tokens.
    pub prev: usize,
    /// `[B, chunks]` chunk statistics (dense).
    pub stats: usize,
    /// `[B, K, top_k]` u32 candidates (top-k).
    pub cand: usize,
    /// `[B, K]` u32 candidate counts (top-k).
    pub ncand: usize,
    /// Total bytes.
    pub bytes: usize,
}

/// What a block-sampler call does on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPlan {
    /// The groups, in order.
    pub groups: Vec<Group>,
    /// Every launch with the slot it runs (`None`: not a per-slot launch), per group in order.
    pub launches: Vec<(Launch, Option<usize>)>,
    /// Launches per group.
    pub per_group: usize,
    /// Host-to-device copies.
    pub uploads: usize,
    /// Device-to-host copies.
    pub downloads: usize,
    /// The scratch layout.
    pub scratch: BlockScratch,
}

/// The plan of a block-sampler call: dense, `2K` launches (`+1`: the row fill of a table map
/// when sampling, or the one-hot rows when greedy); top-k, `K + 1`.
pub fn block_plan(shape: BlockShape) -> BlockPlan {
    let BlockShape {
        batch,
        slots,
        target_vocab,
        valid,
        greedy,
        table,
        top_k,
        ..
    } = shape;
    let groups = Group::split(batch, SB_MAX_BATCH);
    let threads = THREADS as u32;
    let nch = valid.div_ceil(SB_CHUNK).max(1);
    let nfill = target_vocab.div_ceil(SB_FILL).max(1);
    let mut per = Vec::new();
    let launch = |kernel, grid| Launch {
        kernel,
        grid,
        threads,
    };
    let plan_group = |len: usize, per: &mut Vec<(Launch, Option<usize>)>| {
        let rows = u32_of(len * slots);
        match top_k {
            Some(_) => {
                per.push((launch("dspark_sb_topk", (rows, 1, 1)), None));
                for k in 0..slots {
                    per.push((launch("dspark_sb_pick", (u32_of(len), 1, 1)), Some(k)));
                }
            }
            None => {
                if table && !greedy {
                    per.push((launch("dspark_sb_prep", (u32_of(nfill), rows, 1)), None));
                }
                for k in 0..slots {
                    per.push((launch("dspark_sb_bias", (u32_of(nch), 1, 1)), Some(k)));
                    per.push((launch("dspark_sb_pick", (u32_of(len), 1, 1)), Some(k)));
                }
                if greedy {
                    per.push((launch("dspark_sb_onehot", (u32_of(nfill), rows, 1)), None));
                }
            }
        }
    };
    let mut launches = Vec::new();
    for g in &groups {
        plan_group(g.len, &mut per);
        launches.append(&mut per);
    }
    let per_group = if groups.is_empty() {
        0
    } else {
        launches.len() / groups.len()
    };
    let big = groups.first().map_or(0, |g| g.len);
    let bk = batch * slots;
    let tokens = 0;
    let status = tokens + bk * 4;
    let witness = (status + bk * 4).div_ceil(8) * 8;
    let result_bytes = witness + batch * 8;
    let prev = align(result_bytes);
    let stats = align(prev + big * 4);
    let cand = align(stats + big * nch * size_of::<VfChunk>());
    let ncand = align(cand + big * slots * top_k.unwrap_or(0) * 4);
    let bytes = align(ncand + big * slots * 4);
    BlockPlan {
        groups,
        launches,
        per_group,
        uploads: usize::from(table),
        downloads: 1,
        scratch: BlockScratch {
            tokens,
            status,
            witness,
            result_bytes,
            prev,
            stats,
            cand,
            ncand,
            bytes,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(batch: usize, greedy: bool, table: bool, top_k: Option<usize>) -> BlockShape {
        BlockShape {
            batch,
            slots: 7,
            target_vocab: 151_936,
            valid: 151_936,
            rank: 64,
            greedy,
            table,
            top_k,
        }
    }

    /// At most `2K + 1` launches per call (one group), no uploads with an identity map, one
    /// download.
    #[test]
    fn block_sampler_stays_within_its_budgets() {
        for b in [1usize, 8, 64, 256] {
            for greedy in [false, true] {
                for table in [false, true] {
                    for top_k in [None, Some(40)] {
                        let p = block_plan(block(b, greedy, table, top_k));
                        assert!(p.launches.len() <= 2 * 7 + 1, "B {b}");
                        assert_eq!((p.uploads, p.downloads), (usize::from(table), 1));
                    }
                }
            }
        }
        let dense = block_plan(block(8, false, false, None));
        assert_eq!(dense.launches.len(), 14);
        assert_eq!(dense.launches[0].0.grid.0, 149); // 1024-column bias chunks of 151,936
        assert_eq!(block_plan(block(8, true, false, None)).launches.len(), 15);
        assert_eq!(
            block_plan(block(8, false, false, Some(40))).launches.len(),
            8
        );
        assert_eq!(
            block_plan(block(300, false, false, None)).launches.len(),
            28
        );
    }

    fn shape(batch: usize, vocab: usize) -> VerifyShape {
        VerifyShape {
            batch,
            width: 8,
            vocab,
            has_draft: true,
            host_tokens: false,
            stops: 2,
        }
    }

    /// The budgets: at most 4 launches per call up to 128 requests, no uploads with
    /// device tokens and a few stop ids, one download; B = 1 at V = 151,936 fills an H200
    /// (132 SMs) in its first launch.
    #[test]
    fn verify_stays_within_its_budgets() {
        for b in [1usize, 8, 64, 128] {
            let p = verify_plan(shape(b, 151_936));
            assert_eq!(p.launches.len(), 4, "B {b}");
            assert_eq!((p.uploads, p.downloads), (0, 1), "B {b}");
        }
        let p = verify_plan(shape(1, 151_936));
        let (gx, gy, _) = p.launches[0].grid;
        assert_eq!((gx, gy), (19, 15));
        assert!(gx * gy >= 132);
        // Larger batches run in groups of 128: four launches each.
        assert_eq!(verify_plan(shape(300, 1000)).launches.len(), 12);
        // Host tokens and long stop lists cost one upload each.
        let s = VerifyShape {
            host_tokens: true,
            stops: 65,
            ..shape(4, 1000)
        };
        assert_eq!(verify_plan(s).uploads, 2);
        // The scratch holds the largest group, 256-byte aligned.
        let p = verify_plan(shape(64, 151_936));
        assert!(p.scratch.rows.is_multiple_of(256) && p.scratch.out.is_multiple_of(256));
        assert!(p.scratch.bytes >= p.scratch.out + 64 * vf_out_words(8) * 8);
    }

    #[test]
    fn empty_calls_launch_nothing() {
        let p = verify_plan(shape(0, 1000));
        assert!(p.launches.is_empty() && p.groups.is_empty());
    }
}
