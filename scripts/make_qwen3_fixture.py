#!/usr/bin/env python3
"""Write ``crates/dspark/tests/fixtures/qwen3_tiny_hf.json``: HF transformers' reference for the
native ``Qwen3Target`` on the bundled tiny target (f32, eager attention, CPU).

For two held-out prompts (token ids): the last-position logits (first 16, argmax; the full row of
prompt 0) and 20 greedy tokens, each from a full forward over the whole sequence (no KV cache, no
stop token). Usage: ``python3 scripts/make_qwen3_fixture.py``.
"""

import json
from pathlib import Path

import tokenizers
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "python/dspark/models/tiny/target"
OUT = ROOT / "crates/dspark/tests/fixtures/qwen3_tiny_hf.json"
PROMPT_TOKENS = (24, 70)  # prompt 1 is long enough for the native GEMM prefill path (> 32 rows)
STEPS = 20


def main() -> None:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        MODEL, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = tokenizers.Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    texts = json.loads((MODEL.parent / "heldout_prompts.json").read_text())["texts"]
    prompts = []
    with torch.no_grad():
        for text, n in zip(texts, PROMPT_TOKENS, strict=False):
            ids = tok.encode(text).ids[:n]
            seq = list(ids)
            last = model(torch.tensor([seq])).logits[0, -1]
            for _ in range(STEPS):
                step = model(torch.tensor([seq])).logits[0, -1]
                seq.append(int(step.argmax()))
            prompts.append(
                {
                    "tokens": ids,
                    "last_logits_head": [round(float(x), 6) for x in last[:16]],
                    "last_argmax": int(last.argmax()),
                    "last_logits": [round(float(x), 6) for x in last] if not prompts else None,
                    "greedy": seq[len(ids) :],
                }
            )
    fixture = {
        "model": "python/dspark/models/tiny/target",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompts": prompts,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
