//! What a forward of the native target costs on the device-generic path, counted on the CPU
//! (`DSPARK_KERNEL_PATH=tensor`, in a child process of this binary running one test): one
//! upload per forward (ids, positions and the layout maps; the causal mask is built on the
//! device), one attention per layer whatever the batch, and no download.
use crate::child_common::{child_json, print_for_parent};
use crate::targets_common::Tiny;
use candle_core::Device;
use dspark::TargetModel;
use dspark::device::KernelPath;
use dspark::models::qwen3::Qwen3Target;
use dspark::speculator::{LogitRows, TargetInput};
use dspark::trace::counts;
use serde_json::{Value, json};

const MARK: &str = "TARGET_COUNTS ";

fn all_counts() -> Value {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::default();
    tiny.write_with(dir.path(), |_| {}, |_| {});
    let t = Qwen3Target::load(dir.path(), &Device::Cpu).unwrap();
    let mut out = serde_json::Map::new();
    out.insert("layers".into(), json!(t.config().shape.num_hidden_layers));
    // B = 1, then a ragged B = 3 (rows of 4, 1 and 0 new tokens after a prefill).
    for (b, prefill, step) in [
        (1usize, vec![5usize], vec![3usize]),
        (3, vec![5, 2, 7], vec![4, 1, 0]),
    ] {
        let mut cache = t.new_cache(b).unwrap();
        for (i, num) in [prefill, step].iter().enumerate() {
            let width = *num.iter().max().unwrap();
            let tokens: Vec<u32> = (0..b * width).map(|x| (x % 40) as u32 + 1).collect();
            let input = TargetInput {
                tokens: &tokens,
                width,
                num_tokens: num,
                logits: LogitRows::All,
            };
            let c0 = counts();
            t.forward(&mut cache, &input, &[0]).unwrap();
            let c = counts() - c0;
            if i == 1 {
                out.insert(
                    format!("step_{b}"),
                    json!({"uploads": c.uploads, "downloads": c.downloads,
                           "attentions": c.attentions}),
                );
            }
        }
    }
    Value::Object(out)
}

/// Prints the counts for the parent (runs, and passes, on its own too).
#[test]
fn print_target_counts() {
    print_for_parent(MARK, all_counts);
}

#[test]
fn device_forward_uploads_once_and_attends_once_per_layer() {
    let c = child_json("counts::print_target_counts", KernelPath::Tensor, MARK);
    let layers = &c["layers"];
    for key in ["step_1", "step_3"] {
        assert_eq!(
            &c[key]["attentions"], layers,
            "{key}: one attention per layer: {c}"
        );
        assert_eq!(c[key]["uploads"], json!(1), "{key}: {c}");
        assert_eq!(c[key]["downloads"], json!(0), "{key}: {c}");
    }
}
