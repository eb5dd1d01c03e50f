"""Test helpers: write drafter checkpoints and configs into temporary directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dspark._safetensors import save_file
from dspark.example import draft_config, draft_tensors, target_config


def write_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


def write_drafter(
    root: Path,
    config: dict[str, Any],
    tensors: dict[str, np.ndarray],
    *,
    shards: int = 1,
) -> Path:
    """Write ``config.json`` and the tensors (one file, or ``shards`` files + index)."""
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / "config.json", config)
    if shards == 1:
        save_file(tensors, root / "model.safetensors")
        return root
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, root / fname)
        weight_map.update({n: fname for n in part})
    write_json(root / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    return root


def example_pair(tmp: Path, layout: str = "padded") -> tuple[Path, Path]:
    """(drafter dir, target dir) for the generated example of ``layout``."""
    target = write_json(tmp / "target" / "config.json", target_config()).parent
    drafter = write_drafter(tmp / "drafter", draft_config(layout), draft_tensors(layout))  # type: ignore[arg-type]
    return drafter, target
