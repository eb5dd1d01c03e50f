//! Arbitrary bytes as draft and target `config.json`: parsing must never panic. Configs that
//! parse are also planned against an empty and a synthetic checkpoint, which must not panic
//! either (huge sizes must give typed errors, not overflows).
#![no_main]

use dspark::{DraftSpec, Inventory, LoadPlan, TargetSpec, TensorInfo};
use libfuzzer_sys::fuzz_target;

fn synthetic(spec: &DraftSpec) -> Inventory {
    let names = [
        "fc.weight",
        "lm_head.weight",
        "embed_tokens.weight",
        "layers.0.self_attn.q_proj.weight",
        "mtp.0.main_proj.weight",
        "mtp.0.ffn.experts.0.w1.weight",
        "confidence_head.proj.weight",
    ];
    Inventory::from_tensors(
        "fuzz",
        names.iter().map(|n| TensorInfo {
            name: (*n).to_string(),
            dtype: "BF16".into(),
            shape: vec![spec.hidden_size, spec.vocab_size],
            file: "fuzz.safetensors".into(),
            data_offsets: (0, 0),
        }),
    )
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let target = TargetSpec::from_value(&value, "fuzz/config.json");
    let draft = DraftSpec::from_value(&value, "fuzz/config.json");
    if let (Ok(draft), Ok(target)) = (draft, target) {
        let _ = LoadPlan::build(&draft, &target, &Inventory::default());
        let _ = LoadPlan::build(&draft, &target, &synthetic(&draft));
    }
});
