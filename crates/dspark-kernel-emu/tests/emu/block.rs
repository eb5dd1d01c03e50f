//! `kernels/fused_block.cu`, run by the host emulation, against its Rust model: the same
//! tokens, status words and witnesses, and the same draft logits and embeddings bit for bit,
//! over random calls (dtypes, ranks, identity and d2t maps, padded vocabularies, greedy and
//! sampled, dense and top-k, invalid rows), within the launch plan's budgets.

use dspark::sampling::fused::testing::block_model;
use dspark::sampling::fused::{BlockInputs, BlockSettings, BlockShape, block_plan, run_block};
use dspark::sampling::{Mat, Rows3};
use dspark_kernel_emu::Emu;

use crate::common::{Data, Rng};

struct Case {
    dims: [usize; 3],
    vocab_in: usize,
    vocab_t: usize,
    valid: usize,
    rank: usize,
    base: Data,
    w1: Data,
    w2: Data,
    table: Option<Vec<u32>>,
    anchors: Vec<u32>,
    streams: Vec<u64>,
    greedy: bool,
    mult: f32,
    top_k: Option<usize>,
}

fn case(rng: &mut Rng, vd: usize) -> Case {
    let b = 1 + rng.below(5);
    let k = 1 + rng.below(4);
    let rank = [0usize, 3, 17, 64][rng.below(4)];
    let with_table = rng.below(3) == 0;
    let (vt, valid, table) = if with_table {
        let vt = vd + 1 + rng.below(vd);
        let mut ids: Vec<u32> = (0..vt as u32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        ids.truncate(vd);
        (vt, vd, Some(ids))
    } else {
        let vt = vd - rng.below(vd.min(40));
        (vt, vt, None)
    };
    let vin = vt.max(8);
    let mut base = rng.values(b * k * vd, 8.0);
    if rng.below(4) == 0 {
        // Exact ties and masked columns.
        for i in 0..base.len() / 50 {
            let at = rng.below(base.len());
            base[at] = f32::NEG_INFINITY;
            base[i * 50] = base[0];
        }
    }
    if rng.below(8) == 0 {
        let at = rng.below(base.len());
        base[at] = if rng.below(2) == 0 {
            f32::NAN
        } else {
            f32::INFINITY
        };
    }
    let greedy = rng.below(3) == 0;
    let top_k = (rng.below(3) == 0).then(|| 1 + rng.below(valid.min(60)));
    Case {
        dims: [b, k, vd],
        vocab_in: vin,
        vocab_t: vt,
        valid,
        rank,
        base: Data::new(base, rng.below(3)),
        w1: Data::new(rng.values(vin * rank, 1.0), rng.below(3)),
        w2: Data::new(rng.values(vd * rank, 1.0), rng.below(3)),
        table,
        anchors: (0..b).map(|_| rng.below(vin) as u32).collect(),
        streams: (0..b).map(|_| rng.next()).collect(),
        greedy,
        mult: if greedy {
            1.0
        } else {
            0.5 + rng.uniform() * 1.5
        },
        top_k,
    }
}

fn check(c: &Case, what: &str) {
    let [b, k, vd] = c.dims;
    let vin = c.vocab_in;
    let set = BlockSettings {
        dims: c.dims,
        target_vocab: c.vocab_t,
        valid: c.valid,
        rank: c.rank,
        greedy: c.greedy,
        mult: c.mult,
        top_k: c.top_k,
        streams: &c.streams,
        anchors: &c.anchors,
    };
    let base = Rows3::new(c.base.floats(), c.dims).unwrap();
    let w1 = Mat::new(c.w1.floats(), [vin, c.rank]).unwrap();
    let w2 = Mat::new(c.w2.floats(), [vd, c.rank]).unwrap();
    let (want, want_out, want_emb) = block_model(base, w1, w2, &set, c.table.as_deref());
    // The emulated device writes into buffers prefilled with a pattern no kernel writes, so
    // an element a launch forgot shows up.
    let mut out = vec![f32::from_bits(0x7fc0_dead); b * k * c.vocab_t];
    let mut emb = vec![f32::from_bits(0x7fc0_dead); b * k * c.rank];
    let inputs = BlockInputs {
        base: c.base.device(),
        w1: c.w1.device(),
        w2: c.w2.device(),
        table: c.table.as_deref(),
        out: out.as_mut_ptr() as u64,
        emb: emb.as_mut_ptr() as u64,
    };
    let mut emu = Emu::default();
    let got = run_block(&mut emu, &inputs, &set).unwrap();
    assert_eq!(got, want, "{what}: words");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&want_out), "{what}: draft logits");
    assert_eq!(bits(&emb), bits(&want_emb), "{what}: embeddings");
    let plan = block_plan(BlockShape {
        batch: b,
        slots: k,
        target_vocab: c.vocab_t,
        valid: c.valid,
        rank: c.rank,
        greedy: c.greedy,
        table: c.table.is_some(),
        top_k: c.top_k,
    });
    let names: Vec<&str> = plan.launches.iter().map(|(l, _)| l.kernel).collect();
    assert_eq!(emu.launched, names, "{what}");
    assert!(emu.launched.len() <= 2 * k + 1, "{what}");
    assert_eq!(
        (emu.uploads, emu.downloads),
        (plan.uploads, plan.downloads),
        "{what}"
    );
}

#[test]
fn emulated_block_sampler_equals_the_model() {
    let mut rng = Rng(7);
    for i in 0..40 {
        let vd = [7usize, 300, 1100, 2500][i % 4];
        let c = case(&mut rng, vd);
        check(&c, &format!("case {i} V_d {vd}"));
    }
}
