"""Convert a target (and its DSpark drafter) to GGUF with llama.cpp's own converter.

    python benches/peers/convert.py TARGET_DIR [--drafter DRAFTER_DIR] --outdir OUT \\
        [--outtype f32] [--outtype bf16] [--outtype q8_0] [--quantize Q4_K_M]

runs ``convert_hf_to_gguf.py`` of the llama.cpp that ``benches/peers/setup.sh`` installed (the
one llama-cpp-python vendors), in the peers venv, unchanged:

* ``OUT/target-{outtype}.gguf`` from ``TARGET_DIR`` (a Qwen3ForCausalLM directory);
* ``OUT/drafter-{outtype}.gguf`` from ``DRAFTER_DIR`` (``Qwen3DSparkModel``, converted with
  ``--target-model-dir TARGET_DIR``, which gives the drafter the target's vocabulary), when
  given;
* ``OUT/target-{type}.gguf`` (lower case) for each ``--quantize TYPE``: ``llama-quantize`` on the
  target's bf16 GGUF (converted first when missing), as llama.cpp users make ``Q4_K_M`` files.

The converter takes a Qwen3 vocabulary from ``tokenizer.model`` when there is one (SentencePiece)
and otherwise only from a ``tokenizer.json`` whose pre-tokenizer hash it already knows, which
ours is not. ``dspark make-example --memory-bound`` writes ``tokenizer.model``; for a directory
without one (the bundled tiny pair) this script converts a staged copy: symbolic links to every
file plus the ``tokenizer.model`` and ``tokenizer_config.json`` that make-example would write,
and says so. Prints each command and its time; writes ``OUT/convert.json`` with both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEERS = Path(os.environ.get("DSPARK_PEERS_DIR", "/var/tmp/dspark-peers"))


def peers() -> dict[str, Any]:
    """The peers environment ``setup.sh`` recorded (exits with a message when absent)."""
    path = PEERS / "peers.json"
    if not path.is_file():
        sys.exit(f"convert.py: {path} missing: run bash benches/peers/setup.sh first")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def staged_target(target: Path, outdir: Path) -> Path:
    """``target`` itself when it has ``tokenizer.model``, else a staged copy that has one."""
    if (target / "tokenizer.model").is_file():
        return target
    from dspark.memory_bound import write_converter_tokenizer

    stage = outdir / f"staged-{target.name}"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for f in sorted(target.iterdir()):
        (stage / f.name).symlink_to(f.resolve())
    for name in ("tokenizer.model", "tokenizer_config.json"):
        if (stage / name).is_symlink():
            (stage / name).unlink()
    write_converter_tokenizer(target, stage)
    print(f"staged {target} as {stage} (+ tokenizer.model, tokenizer_config.json from dspark)")
    return stage


def run(cmd: list[str], log: list[dict[str, Any]]) -> None:
    """Run ``cmd``, echo it, time it; exit on failure with the converter's last words."""
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    log.append({"command": cmd, "seconds": round(seconds, 1), "returncode": res.returncode})
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-2000:] + res.stderr[-6000:])
        sys.exit(f"convert.py: the converter failed ({res.returncode}) after {seconds:.0f} s")
    print(f"  ok in {seconds:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="target directory (Qwen3ForCausalLM)")
    parser.add_argument("--drafter", type=Path, default=None, help="DSpark drafter directory")
    parser.add_argument("--outdir", type=Path, required=True, help="where the GGUF files go")
    parser.add_argument(
        "--outtype",
        action="append",
        choices=["f32", "bf16", "q8_0"],
        help="default: f32 and bf16 (q8_0: the converter's own 8-bit blocks)",
    )
    parser.add_argument(
        "--quantize",
        action="append",
        default=[],
        metavar="TYPE",
        help="llama-quantize's type (Q4_K_M, Q4_K_S, Q6_K, ...) from the bf16 GGUF",
    )
    args = parser.parse_args(argv)
    doc = peers()
    converter = Path(doc["converter"])
    args.outdir.mkdir(parents=True, exist_ok=True)
    target = staged_target(args.target, args.outdir)
    log: list[dict[str, Any]] = []
    outtypes = args.outtype or ["f32", "bf16"]
    if args.quantize and "bf16" not in outtypes:
        outtypes.append("bf16")
    for outtype in outtypes:
        out = args.outdir / f"target-{outtype}.gguf"
        run([doc["python"], str(converter), str(target), "--outfile", str(out),
             "--outtype", outtype], log)  # fmt: skip
        if args.drafter is not None:
            out = args.outdir / f"drafter-{outtype}.gguf"
            run([doc["python"], str(converter), str(args.drafter), "--target-model-dir",
                 str(target), "--outfile", str(out), "--outtype", outtype], log)  # fmt: skip
    for kind in args.quantize:
        tool = Path(doc.get("tools", {}).get("llama-quantize", "/nonexistent"))
        if not tool.is_file():
            sys.exit("convert.py: llama-quantize missing: run bash benches/peers/setup.sh")
        out = args.outdir / f"target-{kind.lower()}.gguf"
        run([str(tool), str(args.outdir / "target-bf16.gguf"), str(out), kind], log)
    (args.outdir / "convert.json").write_text(json.dumps(log, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
