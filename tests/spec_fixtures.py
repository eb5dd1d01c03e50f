"""Shared fixtures of the speculator tests: the tiny target and drafters of every kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tiny_models import LAYOUTS, make_target, write_drafter  # noqa: E402

import dspark  # noqa: E402

#: Every drafter checkpoint variant the tests build: name -> write_drafter keyword arguments.
VARIANTS: dict[str, dict[str, Any]] = {
    **{layout: {"layout": layout} for layout in LAYOUTS},
    "dflash": {"layout": "shared", "rank": 0, "confidence": False},
}


def drafter_classes() -> list[str]:
    """Names of the drafter classes the package provides (the candle one once merged)."""
    names = ["TorchDrafter"]
    if hasattr(dspark._native, "Drafter") or "Drafter" in getattr(dspark, "__all__", []):
        names.append("Drafter")
    return names


@pytest.fixture(scope="session")
def target() -> Any:
    """The tiny random Qwen3 target (4 layers, hidden 64, vocab 256)."""
    return make_target(0)


@pytest.fixture(scope="session")
def checkpoint(target: Any, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoint(variant)`` -> directory of that tiny drafter checkpoint (written once)."""
    cache: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in cache:
            root = tmp_path_factory.mktemp(f"drafter-{variant}")
            cache[variant] = write_drafter(root, target, **VARIANTS[variant])
        return cache[variant]

    return get


def load_drafter(cls_name: str, path: Path, target: Any) -> Any:
    """Load ``path`` with the named drafter class against ``target``."""
    cls = getattr(dspark, cls_name)
    return cls.from_pretrained(path, target)


@pytest.fixture
def single_thread() -> Any:
    """Run a test with one torch thread (tiny ops on a shared CPU are faster that way)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def native_target(target: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same tiny target saved as an HF directory and loaded by the engine
    (:class:`dspark.NativeTarget`)."""
    root = tmp_path_factory.mktemp("native-target")
    target.save_pretrained(root)
    return dspark.NativeTarget.from_pretrained(root)


@pytest.fixture(params=["hf", "native"])
def spec_target(request: pytest.FixtureRequest, target: Any) -> Any:
    """Both kinds of speculator target over the same weights: the HF model and the engine's
    native Qwen3."""
    if request.param == "hf":
        return target
    return request.getfixturevalue("native_target")
