//! Every step of the noise (mask) token chain, through the public resolver and through
//! `DraftSpec::from_value`.

use dspark::config::noise::resolve_noise_token;
use dspark::{DraftSpec, Error, NoiseToken, NoiseTokenSource};
use serde_json::{Value, json};

const VOCAB: usize = 1000;

fn resolve(v: Value) -> Result<NoiseToken, Error> {
    resolve_noise_token(v.as_object().unwrap(), "draft/config.json", VOCAB)
}

fn hit(v: Value) -> (u32, NoiseTokenSource) {
    let t = resolve(v).unwrap();
    (t.id, t.source)
}

#[test]
fn each_key_alone_is_found() {
    use NoiseTokenSource::*;
    assert_eq!(
        hit(json!({"dflash_config": {"mask_token_id": 1}})),
        (1, DflashConfigMaskTokenId)
    );
    assert_eq!(hit(json!({"mask_token_id": 2})), (2, MaskTokenId));
    assert_eq!(
        hit(json!({"dspark_noise_token_id": 3})),
        (3, DsparkNoiseTokenId)
    );
    assert_eq!(hit(json!({"pard_token": 4})), (4, PardToken));
    assert_eq!(hit(json!({"ptd_token_id": 5})), (5, PtdTokenId));
}

#[test]
fn first_hit_wins_at_every_step() {
    use NoiseTokenSource::*;
    let keys = [
        ("dflash_config.mask_token_id", DflashConfigMaskTokenId),
        ("mask_token_id", MaskTokenId),
        ("dspark_noise_token_id", DsparkNoiseTokenId),
        ("pard_token", PardToken),
        ("ptd_token_id", PtdTokenId),
    ];
    // Config holding keys i.. with id = 10 * position: the first present one must win.
    for start in 0..keys.len() {
        let mut root = serde_json::Map::new();
        for (pos, (key, _)) in keys.iter().enumerate().skip(start) {
            let id = json!(10 * (pos + 1));
            match key.strip_prefix("dflash_config.") {
                Some(inner) => {
                    root.insert("dflash_config".into(), json!({ inner: id }));
                }
                None => {
                    root.insert((*key).into(), id);
                }
            }
        }
        let (id, source) = hit(Value::Object(root));
        assert_eq!(source, keys[start].1, "start {start}");
        assert_eq!(source.key(), keys[start].0);
        assert_eq!(id as usize, 10 * (start + 1));
    }
}

#[test]
fn null_top_level_mask_token_id_is_skipped_but_missing_keys_are_not_errors() {
    use NoiseTokenSource::*;
    assert_eq!(
        hit(json!({"mask_token_id": null, "dspark_noise_token_id": 7})),
        (7, DsparkNoiseTokenId)
    );
    assert_eq!(
        hit(json!({"mask_token_id": null, "ptd_token_id": 8})),
        (8, PtdTokenId)
    );
    // dflash_config present without the key: falls through.
    assert_eq!(
        hit(json!({"dflash_config": {}, "mask_token_id": 9})),
        (9, MaskTokenId)
    );
    // A null dflash_config is an absent one.
    assert_eq!(
        hit(json!({"dflash_config": null, "pard_token": 6})),
        (6, PardToken)
    );
    // Only null mask_token_id: nothing found.
    let e = resolve(json!({"mask_token_id": null})).unwrap_err();
    assert_eq!(e.code(), "no-noise-token");
}

#[test]
fn present_null_elsewhere_is_an_error_naming_the_key() {
    for (cfg, key) in [
        (
            json!({"dflash_config": {"mask_token_id": null}, "mask_token_id": 3}),
            "dflash_config.mask_token_id",
        ),
        (
            json!({"dspark_noise_token_id": null, "pard_token": 3}),
            "dspark_noise_token_id",
        ),
        (json!({"pard_token": null, "ptd_token_id": 3}), "pard_token"),
        (json!({"ptd_token_id": null}), "ptd_token_id"),
    ] {
        let e = resolve(cfg).unwrap_err();
        assert_eq!(e.code(), "bad-config", "{e}");
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
        assert!(e.to_string().contains("draft/config.json"), "{e}");
    }
}

#[test]
fn wrong_types_are_bad_config() {
    for bad in [
        json!(true),
        json!(false),
        json!(3.0),
        json!(3.5),
        json!("3"),
        json!([3]),
        json!({"id": 3}),
    ] {
        for key in [
            "mask_token_id",
            "dspark_noise_token_id",
            "pard_token",
            "ptd_token_id",
        ] {
            let e = resolve(json!({ key: bad.clone() })).unwrap_err();
            assert_eq!(e.code(), "bad-config", "{key} = {bad}: {e}");
            assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
        }
        let e = resolve(json!({"dflash_config": {"mask_token_id": bad.clone()}})).unwrap_err();
        assert!(
            e.to_string().contains("`dflash_config.mask_token_id`"),
            "{e}"
        );
    }
    let e = resolve(json!({"dflash_config": [1], "mask_token_id": 3})).unwrap_err();
    assert!(e.to_string().contains("`dflash_config`"), "{e}");
}

#[test]
fn out_of_range_ids_name_the_key_and_vocab() {
    for (cfg, key, id) in [
        (json!({"mask_token_id": 1000}), "mask_token_id", 1000),
        (json!({"mask_token_id": -1}), "mask_token_id", -1),
        (
            json!({"dflash_config": {"mask_token_id": 5000}}),
            "dflash_config.mask_token_id",
            5000,
        ),
        (
            json!({"dspark_noise_token_id": -7}),
            "dspark_noise_token_id",
            -7,
        ),
        (json!({"pard_token": 1001}), "pard_token", 1001),
        (
            json!({"ptd_token_id": 4_294_967_296_i64}),
            "ptd_token_id",
            4_294_967_296,
        ),
    ] {
        match resolve(cfg).unwrap_err() {
            Error::NoiseTokenOutOfRange {
                key: k,
                id: got,
                vocab_size,
                ..
            } => {
                assert_eq!((k.as_str(), got, vocab_size), (key, id, VOCAB));
            }
            other => panic!("{key}: expected noise-token-out-of-range, got {other}"),
        }
    }
    // The last valid id is accepted.
    assert_eq!(hit(json!({"pard_token": 999})).0, 999);
    assert_eq!(hit(json!({"pard_token": 0})).0, 0);
}

#[test]
fn none_present_names_all_five_keys() {
    let e = resolve(json!({"vocab_size": 3})).unwrap_err();
    assert_eq!(e.code(), "no-noise-token");
    let msg = e.to_string();
    for key in NoiseTokenSource::ORDER {
        assert!(msg.contains(&format!("`{}`", key.key())), "{msg}");
    }
    assert!(msg.contains("draft/config.json"));
}

#[test]
fn draft_spec_uses_the_chain_with_its_own_vocab() {
    // DeepSpec config whose mask_token_id is null: pard_token supplies the id.
    let mut cfg = crate::config_common::qwen3_4b_deepspec();
    cfg["mask_token_id"] = Value::Null;
    cfg["pard_token"] = json!(151670);
    let s = DraftSpec::from_value(&cfg, "c.json").unwrap();
    assert_eq!(
        (s.noise_token.id, s.noise_token.source),
        (151670, NoiseTokenSource::PardToken)
    );
    // The range is the draft's V_in (vocab_size).
    cfg["pard_token"] = json!(151936);
    let e = DraftSpec::from_value(&cfg, "c.json").unwrap_err();
    assert_eq!(e.code(), "noise-token-out-of-range");
    cfg.as_object_mut().unwrap().remove("pard_token");
    let e = DraftSpec::from_value(&cfg, "c.json").unwrap_err();
    assert_eq!(e.code(), "no-noise-token");
    // Speculators: a translated dflash_config.mask_token_id beats the top-level one.
    let mut spec = crate::config_common::glm52_speculators();
    spec["dflash_config"] = json!({"mask_token_id": 154857});
    let s = DraftSpec::from_value(&spec, "c.json").unwrap();
    assert_eq!(
        s.noise_token.source,
        NoiseTokenSource::DflashConfigMaskTokenId
    );
    assert_eq!(s.noise_token.id, 154857);
    // DeepSeek-V4.1: the key is reported with its text_config prefix.
    let mut v41 = crate::config_common::deepseek_v41_flash();
    v41["text_config"]["dspark_noise_token_id"] = json!(true);
    let e = DraftSpec::from_value(&v41, "c.json").unwrap_err();
    assert!(
        e.to_string()
            .contains("`text_config.dspark_noise_token_id`"),
        "{e}"
    );
}
