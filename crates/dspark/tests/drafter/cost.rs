//! What the drafter states its block pass costs (`Drafter::propose_cost`): the scheduling
//! policy's prior for proposing, counted from the checkpoint's own shapes.
use crate::drafter_common::{H, HD, HEADS, INTER, KV, LAYERS, Tiny, load};
use dspark::Drafter;
use dspark::nn::WeightDtype;

#[test]
fn the_block_cost_counts_the_layers_and_the_head() {
    for (dtype, bytes) in [("f32", 4usize), ("bf16", 2)] {
        let tiny = Tiny {
            draft_vocab: Some(56),
            dtype,
            ..Tiny::default()
        };
        let (_dir, d) = load(&tiny);
        let c = d
            .propose_cost()
            .unwrap()
            .expect("a native drafter states its cost");
        c.validate().unwrap();
        let layer = H * (2 * HEADS * HD + 2 * KV * HD) + 3 * H * INTER;
        let weights = LAYERS * layer + 56 * H;
        assert_eq!(c.layers, LAYERS);
        assert_eq!(c.flops_per_token, 2.0 * weights as f64);
        // The layers' matrices and the head as their kernels read them: at least their
        // elements in the checkpoint's dtype, at most in f32 with the packed panels' padding.
        let elements = (LAYERS * layer + 56 * H) as f64;
        assert!(c.weight_bytes >= elements * bytes as f64, "{c:?}");
        assert!(c.weight_bytes <= elements * 4.0 * 1.5, "{c:?}");
        let want = if dtype == "f32" {
            WeightDtype::F32
        } else {
            WeightDtype::BF16
        };
        assert_eq!(c.dtype, want);
        assert_eq!(c.quant, None);
    }
}
