//! What a proposal costs on the device-generic path, counted on the CPU: candle ops (each a
//! kernel launch on a GPU), host ↔ device transfers and attention calls, at B = 1 and B = 8.
//! The counts are taken in a child process of this test binary that runs one test on one
//! thread under `DSPARK_KERNEL_PATH=tensor`: candle's op counter is process-wide.
use crate::child_common::{child_json, print_for_parent};
use crate::drafter_common::{Tiny, context, load};
use dspark::device::KernelPath;
use dspark::sampling::Seeds;
use dspark::trace::{counts, tensor_ops};
use dspark::{Drafter, ProposeOptions};
use serde_json::{Value, json};

const MARK: &str = "COUNTS ";

/// Ops, uploads, downloads and attentions of one call of `f`.
fn measure(f: impl FnOnce()) -> Value {
    let (c0, o0) = (counts(), tensor_ops());
    f();
    let (o1, c1) = (tensor_ops(), counts());
    let c = c1 - c0;
    // `tensor_ops` itself makes one tensor per reading.
    json!({"ops": o1 - o0 - 1, "uploads": c.uploads, "downloads": c.downloads,
           "attentions": c.attentions})
}

fn all_counts() -> Value {
    let tiny = Tiny::default();
    let (_dir, d) = load(&tiny);
    let layers = d.spec().shape.num_hidden_layers;
    let t = 6;
    let opts = ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        temperature: 0.8,
        seeds: Seeds::Scalar(3),
        top_k: None,
    };
    let mut out = serde_json::Map::new();
    out.insert("layers".into(), json!(layers));
    for b in [1usize, 8] {
        let ctx = context(7, b, t);
        let anchors: Vec<u32> = (0..b as u32).map(|x| 1 + x).collect();
        // A first call grows the device rope tables; the counts are a steady call's.
        d.propose(&ctx, &anchors, &[3], &opts).unwrap();
        out.insert(
            format!("stateless_{b}"),
            measure(|| {
                d.propose(&ctx, &anchors, &[3], &opts).unwrap();
            }),
        );
        let states: Vec<_> = (0..b)
            .map(|j| {
                let mut s = d.new_state().unwrap();
                d.extend(&mut s, &ctx.get(j).unwrap(), 3).unwrap();
                s
            })
            .collect();
        let refs: Vec<_> = states.iter().collect();
        out.insert(
            format!("cached_{b}"),
            measure(|| {
                d.propose_cached(&refs, &anchors, &opts).unwrap();
            }),
        );
    }
    Value::Object(out)
}

/// Prints the counts for the parent (runs, and passes, on its own too).
#[test]
fn print_counts() {
    print_for_parent(MARK, all_counts);
}

#[test]
fn device_path_costs_do_not_grow_with_the_batch() {
    let c = child_json("counts::print_counts", KernelPath::Tensor, MARK);
    eprintln!("{c}");
    let layers = c["layers"].as_u64().unwrap();
    let ops = |key: &str| c[key]["ops"].as_u64().unwrap();
    // Stateless: the same ops at B = 1 and B = 8 (no loop over requests or heads).
    assert_eq!(
        ops("stateless_1"),
        ops("stateless_8"),
        "ops grow with B: {c}"
    );
    // Cached: the states' keys and values are each request's own tensors, gathered into the
    // batch by one stack per layer (k and v): a view per request and tensor, nothing else.
    assert!(
        ops("cached_8") - ops("cached_1") <= 7 * 4 * layers,
        "cached ops grow by more than the gather: {c}"
    );
    for kind in ["stateless", "cached"] {
        let (one, eight) = (&c[format!("{kind}_1")], &c[format!("{kind}_8")]);
        for x in [one, eight] {
            assert_eq!(
                x["attentions"],
                json!(layers),
                "{kind}: one attention per layer"
            );
            // The call's one upload: block ids and positions (rope rows are gathered on the
            // device; the stateless context is where the caller put it).
            assert_eq!(x["uploads"], json!(1), "{kind}: {c}");
            // Draft logits and confidences come back (the engine's verify keeps the logits).
            assert_eq!(x["downloads"], json!(2), "{kind}: {c}");
        }
    }
}
