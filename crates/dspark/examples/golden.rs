//! Golden tokens (temporary).
// Prints the tokens the speculative loop commits on the bundled pair for a fixed set of
// requests with their own seeds (sampled, full and threshold verification) and greedy.
use candle_core::Device;
use dspark::speculator::{Request, Speculator, SpeculatorOptions, VerifyPolicy};
use dspark::{Qwen3Drafter, Qwen3Target};
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/dspark/models/tiny");
    let prompts: Vec<Vec<u32>> = vec![
        (1..40).map(|i| (i * 37 % 2900) as u32 + 5).collect(),
        (1..9).map(|i| (i * 101 % 2900) as u32 + 5).collect(),
        (1..70).map(|i| (i * 13 % 2900) as u32 + 5).collect(),
    ];
    for (temperature, verify) in [
        (0.0f32, VerifyPolicy::Full),
        (0.8, VerifyPolicy::Full),
        (0.8, VerifyPolicy::Threshold(0.4)),
        (1.0, VerifyPolicy::Full),
    ] {
        let target = Qwen3Target::load(&root.join("target"), &Device::Cpu).unwrap();
        let drafter =
            Qwen3Drafter::load(&root.join("drafter"), &target.target_spec(), target.shared_weights())
                .unwrap();
        let options = SpeculatorOptions {
            temperature,
            top_p: 0.95,
            verify: verify.clone(),
            ..SpeculatorOptions::default()
        };
        let s = Speculator::new(target, drafter, options).unwrap();
        let reqs: Vec<Request> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Request {
                prompt: p.clone(),
                max_new_tokens: 40,
                stop_token_ids: vec![],
                seed: Some(1000 + i as u64),
            })
            .collect();
        let g = s.generate(&reqs, None).unwrap();
        println!("{temperature} {verify:?} {:?}", g.tokens);
    }
}
