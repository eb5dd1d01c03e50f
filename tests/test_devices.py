"""Choosing where the native target and the drafter run (``device=``), on any machine.

The CUDA half of the contract (the same greedy tokens on ``cuda:0`` as on the CPU) is in
``tests/test_cuda.py``; here: the CPU is explicit or implied, a CUDA device this build or machine
cannot give is a typed ``device-unavailable`` error, a malformed name is ``invalid-argument``,
and a drafter cannot be put elsewhere than the native target whose weights it shares.
"""

from __future__ import annotations

import pytest

import dspark
from dspark.bundled import bundled_dir

ROOT = bundled_dir()


@pytest.fixture(scope="module")
def native() -> dspark.NativeTarget:
    return dspark.NativeTarget.from_pretrained(ROOT / "target", device="cpu")


def test_cpu_is_the_default_and_can_be_named(native: dspark.NativeTarget) -> None:
    assert native.device == "cpu"
    assert dspark.NativeTarget.from_pretrained(ROOT / "target").device == "cpu"
    implied = dspark.Drafter.from_pretrained(ROOT / "drafter", native)
    named = dspark.Drafter.from_pretrained(ROOT / "drafter", native, device=" CPU ")
    assert implied.device == named.device == "cpu"
    prompt = [[5, 17, 99, 3, 250, 7]]
    a = dspark.Speculator(native, implied).generate(prompt, 12)
    b = dspark.Speculator(native, named).generate(prompt, 12)
    assert (
        a.tokens
        == b.tokens
        == dspark.Speculator(native, named).generate_target_only(prompt, 12).tokens
    )


@pytest.mark.parametrize("bad", ["", "gpu", "cuda:", "cuda:x", "cuda:-1", "cpu:0", "metal"])
def test_malformed_device_names_are_invalid_arguments(
    native: dspark.NativeTarget, bad: str
) -> None:
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(ROOT / "target", device=bad)
    assert e.value.code == "invalid-argument"
    with pytest.raises(dspark.InputError) as e:
        dspark.Drafter.from_pretrained(ROOT / "drafter", native, device=bad)
    assert e.value.code == "invalid-argument"


@pytest.mark.parametrize("bad", [0, None, b"cpu", ["cpu"]])
def test_non_string_devices_are_invalid_arguments(native: dspark.NativeTarget, bad: object) -> None:
    if bad is not None:
        with pytest.raises(dspark.InputError) as e:
            dspark.NativeTarget.from_pretrained(ROOT / "target", device=bad)  # type: ignore[arg-type]
        assert e.value.code == "invalid-argument"
        with pytest.raises(dspark.InputError) as e:
            dspark.Drafter.from_pretrained(ROOT / "drafter", native, device=bad)  # type: ignore[arg-type]
        assert e.value.code == "invalid-argument"


def test_a_cuda_device_this_machine_lacks_is_device_unavailable() -> None:
    info = dspark.build_info()
    missing = f"cuda:{info['cuda_devices']}"  # one past the last device the driver reports
    names = [missing] if info["cuda_devices"] > 0 else ["cuda", "cuda:0", missing]
    for name in names:
        with pytest.raises(dspark.InputError) as e:
            dspark.NativeTarget.from_pretrained(ROOT / "target", device=name)
        assert e.value.code == "device-unavailable", name
        assert "cuda:" in str(e.value)


def test_cuda_without_a_device_says_which_build_and_why(native: dspark.NativeTarget) -> None:
    """On the CPU wheel, or the CUDA wheel where no device is usable (no driver: CI), asking
    for CUDA is a typed ``device-unavailable`` error that says which build this is and, for
    the CUDA wheel, why it has no device (the reason ``build_info()`` gives)."""
    info = dspark.build_info()
    if info["cuda_devices"] > 0:
        pytest.skip("this machine has a usable CUDA device")
    build = "CUDA build" if info["cuda"] else "CPU build"
    calls = {
        "NativeTarget": lambda: dspark.NativeTarget.from_pretrained(ROOT / "target", device="cuda"),
        "Drafter": lambda: dspark.Drafter.from_pretrained(ROOT / "drafter", native, device="cuda"),
    }
    for what, call in calls.items():
        with pytest.raises(dspark.DSparkError) as e:
            call()
        assert isinstance(e.value, dspark.InputError), what
        assert e.value.code == "device-unavailable", what
        message = str(e.value)
        assert "cuda:0" in message and build in message, (what, message)
        assert dspark.__version__ in message, (what, message)
        if info["cuda"]:
            assert info["cuda_error"] in message, (what, message)


def test_the_drafter_of_a_native_target_runs_on_its_device(native: dspark.NativeTarget) -> None:
    # The drafter shares the target's embedding and lm_head: another device is a mismatch (or,
    # where that device cannot exist here, unavailable), never a silent copy.
    with pytest.raises(dspark.InputError) as e:
        dspark.Drafter.from_pretrained(ROOT / "drafter", native, device="cuda:0")
    want = "device-mismatch" if dspark.build_info()["cuda_devices"] > 0 else "device-unavailable"
    assert e.value.code == want


@pytest.mark.torch
def test_a_torch_targets_drafter_follows_it_where_this_build_can(tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    from tiny_models import make_target, write_drafter

    target = make_target()
    path = write_drafter(tmp_path / "drafter", target, "shared")
    assert dspark.Drafter.from_pretrained(path, target).device == "cpu"

    class OnGpu:
        """The HF target as a model on ``cuda:0`` reports itself (weights stay on the CPU)."""

        device = torch.device("cuda:0")
        config = target.config

        def get_input_embeddings(self):  # type: ignore[no-untyped-def]
            return target.get_input_embeddings()

        def get_output_embeddings(self):  # type: ignore[no-untyped-def]
            return target.get_output_embeddings()

    if dspark.build_info()["cuda_devices"] > 0:
        assert dspark.Drafter.from_pretrained(path, OnGpu()).device == "cuda:0"
    else:
        # The CPU wheel (or the CUDA wheel where no device is usable) keeps such a drafter on
        # the CPU (the target's logits cross once per round) rather than refusing a target it
        # can serve; asking for the device is a typed refusal.
        assert dspark.Drafter.from_pretrained(path, OnGpu()).device == "cpu"
        with pytest.raises(dspark.InputError) as e:
            dspark.Drafter.from_pretrained(path, OnGpu(), device="cuda:0")
        assert e.value.code == "device-unavailable"


def test_a_python_target_declaring_a_gpu_still_runs_on_the_cpu_wheel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A target's ``device`` attribute says where its outputs live; the CPU wheel reads a
    target that declares a GPU (but hands over host tensors) on the host, same tokens."""
    pytest.importorskip("torch")
    if dspark.build_info()["cuda"]:
        pytest.skip("the CUDA wheel would look for that device")
    from tiny_models import make_target, write_drafter

    from dspark.target import HFTarget

    model = make_target()
    path = write_drafter(tmp_path / "drafter", model, "shared")
    drafter = dspark.Drafter.from_pretrained(path, model)
    assert HFTarget(model).device == "cpu"

    class Declares(HFTarget):
        @property
        def device(self) -> str:
            return "cuda:0"

    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    want = dspark.Speculator(model, drafter).generate(prompts, 8).tokens
    got = dspark.Speculator(Declares(model), drafter).generate(prompts, 8).tokens
    assert got == want


def test_a_host_context_takes_the_host_entry(native: dspark.NativeTarget) -> None:
    """Only a CUDA context given to a drafter on CUDA is read in place (its draft logits kept on
    the device); a host context is the ordinary proposal, with host draft logits."""
    import numpy as np

    drafter = dspark.Drafter.from_pretrained(ROOT / "drafter", native)
    ctx = np.zeros((1, 4, drafter.context_width), dtype=np.float32)
    assert not drafter._on_cuda(ctx)
    p = drafter.propose(ctx, [1])
    assert isinstance(p.draft_logits, np.ndarray)
    assert p.draft_logits.shape[:2] == (1, drafter.num_draft_tokens)
