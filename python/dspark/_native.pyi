"""Type stubs for the native half of dspark (``dspark._native``).

The extension is the validation boundary: arguments it checks itself (every tensor, id list,
sampling option and per-request value) are typed ``object`` here, because any value gives a
result or a typed ``dspark.DSparkError``, never a ``TypeError``. The typed Python front
(``dspark.kernels``, ``dspark.Drafter``, ``dspark.Speculator``...) declares which values are
valid. ``tests/test_stubs.py`` checks this file against the built extension.
"""

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias, TypedDict, final

import numpy as np
import numpy.typing as npt

from dspark._typing import DLPackTensor

__version__: str
#: The engine's documented size limits (``docs/errors.md``), name -> value.
LIMITS: dict[str, int]

# Ids: a list/tuple of ints or an int32/int64/uint32 array or tensor (copied once, then checked).
_Ids: TypeAlias = object

class DSparkError(Exception):
    """Base class of every dspark error."""

    code: str
    problems: list[tuple[str, str]]

class ConfigError(DSparkError): ...
class CheckpointError(DSparkError): ...
class VocabError(DSparkError): ...
class InputError(DSparkError): ...
class BackendError(DSparkError): ...

class InternalError(DSparkError):
    """A bug in dspark (a caught panic); code ``internal``."""

@final
class DraftSpec:
    """A drafter config normalized from any accepted shape."""

    @staticmethod
    def from_pretrained(path_or_dict: str | os.PathLike[str] | dict[str, Any]) -> DraftSpec: ...
    @property
    def format(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def sample_from_anchor(self) -> bool: ...
    @property
    def noise_token_id(self) -> int: ...
    @property
    def noise_token_source(self) -> str: ...
    @property
    def target_layer_ids(self) -> list[int]: ...
    @property
    def capture_layer_ids(self) -> list[int]: ...
    @property
    def markov_rank(self) -> int: ...
    @property
    def confidence_head(self) -> bool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def draft_vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class VocabLayout:
    """Vocabulary layout of a drafter/target pair: ``full``, ``padded`` or ``reduced``."""

    def __init__(self, input_vocab: int, draft_vocab: int, target_vocab: int) -> None:
        """Each size a non-negative int up to ``2**22`` (``too-large`` above)."""
    @property
    def kind(self) -> str: ...
    @property
    def input_vocab(self) -> int: ...
    @property
    def draft_vocab(self) -> int: ...
    @property
    def target_vocab(self) -> int: ...
    @property
    def is_reduced(self) -> bool: ...
    @property
    def expanded_input(self) -> bool: ...
    @property
    def padded_rows(self) -> int: ...

@final
class IdMap:
    """Draft-to-target id map: identity or a validated ``d2t`` offset table."""

    @staticmethod
    def identity(target_vocab: int) -> IdMap: ...
    @staticmethod
    def from_offsets(d2t: _Ids, target_vocab: int) -> IdMap: ...
    @property
    def kind(self) -> str: ...
    @property
    def is_identity(self) -> bool: ...
    @property
    def target_vocab(self) -> int: ...
    def offsets(self) -> npt.NDArray[np.int64] | None: ...
    def to_target(self, draft_ids: _Ids) -> npt.NDArray[np.int64]: ...

@final
class Report:
    """What ``inspect`` found."""

    @property
    def ok(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...
    def to_json(self) -> str: ...

def inspect(
    draft: str | os.PathLike[str],
    target: str | os.PathLike[str] | None = None,
    *,
    sts: bool | None = None,
) -> Report:
    """``sts=False``: leave the calibration file (``sts.json``) out of the check."""

# What ``build_info`` returns (functional form: the stub names no class the module lacks).
_BuildInfo = TypedDict(  # noqa: UP013 (a class would have to exist in the module)
    "_BuildInfo",
    {
        "version": str,
        "cuda": bool,
        "cuda_devices": int,
        "cuda_error": str | None,
        "kernel_path": Literal["fast", "tensor", "fused"],
        "cpu_kernel": Literal["amx-bf16", "avx512-bf16", "avx512", "avx2", "portable"],
        "quant_kernel": Literal["amx-int8", "avx512vnni", "avxvnni", "avx2", "portable"],
    },
)

def gguf_side_files(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a GGUF model file carries beside its tensors: ``config`` (a ``config.json`` dict),
    ``tokenizer`` (a ``tokenizer.json`` text, or ``None`` with ``tokenizer_error`` saying why),
    ``tokenizer_config`` (chat template, special tokens) and ``generation_config``."""

def build_info() -> _BuildInfo:
    """The version, CUDA support (compiled, devices usable, why none) and the host kernel path.

    Raises ``InputError`` (code ``invalid-argument``) for an invalid ``DSPARK_KERNEL_PATH``.
    """

def serve(argv: list[str], bundled: str | None = None) -> int:
    """Run ``dspark serve`` with ``argv`` (the arguments after ``serve``), the GIL released,
    until it stops; the exit code (0 stopped, 1 could not start, 2 usage)."""

# --- kernels (DLPack in: numpy arrays, torch tensors, anything with ``__dlpack__``) ---------
# Use the typed wrappers in ``dspark.kernels`` (re-exported as ``dspark.sample_block`` etc.);
# these natives return numpy arrays for host results.

# A tensor argument: any DLPack producer (checked: device, dtype, shape, contiguity).
_Tensor: TypeAlias = object
# A sampling option or per-request value (a scalar or a list of them; checked natively).
_Option: TypeAlias = object

# A result the engine leaves on a CUDA device (CUDA builds only): a DLPack producer.
_DeviceArray: TypeAlias = DLPackTensor

def sample_block(
    base_logits: _Tensor,
    markov_w1: _Tensor,
    markov_w2: _Tensor,
    anchors: _Tensor,
    *,
    temperature: _Option = None,
    seed: _Option = None,
    target_vocab_size: _Option = None,
    d2t: _Tensor | None = None,
    top_k: _Option = None,
    logit_scale: _Option = None,
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.float32] | _DeviceArray,
    npt.NDArray[np.float32] | _DeviceArray,
]:
    """``(tokens [B,K], draft logits [B,K,V_t], prev embeddings [B,K,r])``; the last two stay
    on the device for CUDA inputs."""

def verify(
    target_logits: _Tensor,
    draft_tokens: _Tensor,
    draft_logits: _Tensor | None = None,
    *,
    temperature: _Option = None,
    top_k: _Option = None,
    top_p: _Option = None,
    seed: _Option = None,
    num_draft: _Ids | None = None,
    stop_token_ids: _Ids | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def confidence(
    hidden: _Tensor,
    prev_embeddings: _Tensor | None,
    weight: _Tensor,
    bias: _Option = None,
    *,
    sts: _Option = None,
) -> npt.NDArray[np.float32]: ...
def schedule_threshold(confidence: _Tensor, threshold: _Option) -> list[int]: ...
def schedule_lengths(
    confidence: _Tensor,
    steps_per_second: _Option,
    interpolation: _Option = None,
    *,
    ahead: _Tensor | None = None,
    batch_wide: bool = False,
) -> list[int]: ...
def schedule_pipelined(
    stale: _Tensor,
    current: _Tensor,
    steps_per_second: _Option,
    interpolation: _Option = None,
) -> list[int]: ...

# Test hooks: only in a wheel built with the ``test-hooks`` feature (``install.sh --test``).
def _dlpack_describe(obj: _Tensor) -> tuple[str, list[int], str, int]: ...
def _dlpack_sum(obj: _Tensor) -> float: ...
def _cuda_libraries() -> list[str]: ...
def _test_panic(message: str) -> None:
    """Panics inside the panic boundary: raises ``InternalError`` (tests only)."""

@final
class Drafter:
    """The Qwen3-shaped DSpark drafter in candle. Use ``dspark.Drafter`` (the Python front)."""

    @staticmethod
    def plan_sharing(path: str | os.PathLike[str], target_config: str) -> tuple[bool, bool]:
        """``(embed_shared, lm_head_shared)`` of the load plan against a target config (JSON)."""
    @staticmethod
    def load(
        path: str | os.PathLike[str],
        target_config: str,
        embed_tokens: _Tensor | None = None,
        lm_head: _Tensor | None = None,
        sts: _Option = None,
        device: str = "cpu",
        dtype: str | None = None,
    ) -> Drafter:
        """Load onto ``device`` (``cpu``, ``cuda``, ``cuda:N``); ``embed_tokens``/``lm_head``
        (DLPack, CPU) are required where shared; weight matrices in ``dtype`` (``None``: their
        own)."""
    @property
    def device(self) -> str:
        """``cpu`` or ``cuda:N``."""
    @property
    def sts_temperatures(self) -> list[float] | None:
        """The confidence calibration in use (per-position temperatures), or ``None``."""
    @property
    def block_size(self) -> int: ...
    @property
    def num_draft_tokens(self) -> int: ...
    @property
    def noise_token_id(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def draft_vocab_size(self) -> int: ...
    @property
    def target_vocab_size(self) -> int: ...
    @property
    def draft_id_to_target_id(self) -> npt.NDArray[np.int64] | None: ...
    @property
    def has_own_embed_tokens(self) -> bool: ...
    @property
    def has_own_lm_head(self) -> bool: ...
    @property
    def target_layer_ids(self) -> list[int]: ...
    @property
    def capture_layer_ids(self) -> list[int]: ...
    @property
    def sample_from_anchor(self) -> bool: ...
    @property
    def has_confidence_head(self) -> bool: ...
    @property
    def context_width(self) -> int: ...
    @property
    def markov_rank(self) -> int: ...
    @property
    def warnings(self) -> list[tuple[str, str]]: ...
    def propose(
        self,
        context: _Tensor,
        anchors: _Ids,
        *,
        start_positions: _Option = None,
        temperature: _Option = None,
        seed: _Option = None,
        top_k: _Option = None,
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.float32] | _DeviceArray,
        npt.NDArray[np.float32] | None,
    ]:
        """Stateless drafting over ``context [B, T, L*H_t]`` (DLPack).

        Returns ``(tokens [B,K] int64, draft_logits [B,K,V_t] float32, confidence [B,K] | None)``;
        a CUDA context on the drafter's device is read in place and its draft logits stay there
        (a DLPack array).
        """
    @staticmethod
    def load_native(
        path: str | os.PathLike[str],
        target: NativeTarget,
        sts: _Option = None,
        device: str | None = None,
        dtype: str | None = None,
    ) -> Drafter:
        """Load for a native target, sharing its embedding / lm_head (no copy), on its device;
        weight matrices in ``dtype`` (``None``: their own, the target's for shared ones)."""
    def new_state(self) -> DraftState: ...
    def propose_states(
        self,
        states: list[DraftState],
        anchors: _Ids,
        *,
        temperature: _Option = None,
        seed: _Option = None,
        top_k: _Option = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32] | None]:
        """One block pass per state; anchor ``b`` sits at ``states[b].end``."""

@final
class DraftState:
    """One request's context KV cache (made by ``Drafter.new_state``)."""

    def extend(self, features: _Tensor, start_position: int) -> None:
        """Append ``[T, L*H_t]`` features from ``start_position``; held rows are skipped."""
    def truncate(self, n: int) -> None: ...
    def clear(self) -> None: ...
    @property
    def length(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    def __len__(self) -> int: ...

@final
class NativeTarget:
    """The engine's candle Qwen3 causal LM (on the CPU or a CUDA device)."""

    @staticmethod
    def load(
        path: str | os.PathLike[str],
        device: str = "cpu",
        dtype: str | None = None,
        kv_dtype: str | None = None,
    ) -> NativeTarget:
        """Load an HF ``Qwen3ForCausalLM`` directory (config.json + safetensors) onto ``device``,
        weight matrices in ``dtype`` (``float32``, ``bfloat16``, ``float16``; ``None``: the
        checkpoint's), the KV cache in ``kv_dtype`` (``None``: the engine's default)."""
    @property
    def kv_dtype(self) -> str:
        """``float32``, ``float16`` or ``bfloat16``: the KV cache's element type."""
    @property
    def weight_dtype(self) -> str:
        """``float32``, ``bfloat16``, ``float16``, or ``q8_0`` / ``q4_k`` when quantized at load."""
    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one forward step reads."""
    @property
    def device(self) -> str:
        """``cpu`` or ``cuda:N``."""
    @property
    def vocab_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    def logits(self, ids: _Ids) -> npt.NDArray[np.float32]:
        """Float32 logits ``[S, V_t]`` of every position of one sequence (an empty cache)."""

@final
class SpeculationStats:
    """What a generation did: rounds, drafted / accepted / committed tokens, acceptance per
    draft position and the time split (seconds)."""

    @property
    def rounds(self) -> int: ...
    @property
    def plain_rounds(self) -> int: ...
    @property
    def request_rounds(self) -> int: ...
    @property
    def committed_tokens(self) -> int: ...
    @property
    def drafted_tokens(self) -> int: ...
    @property
    def accepted_tokens(self) -> int: ...
    @property
    def position_attempts(self) -> list[int]: ...
    @property
    def position_accepts(self) -> list[int]: ...
    @property
    def drafter_seconds(self) -> float: ...
    @property
    def target_seconds(self) -> float: ...
    @property
    def kernel_seconds(self) -> float: ...
    @property
    def total_seconds(self) -> float: ...
    @property
    def prefill_seconds(self) -> float: ...
    @property
    def confidence_records(self) -> list[tuple[int, float, bool]]: ...
    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens committed per request-round (accepted drafts + 1)."""
    @property
    def per_position_acceptance(self) -> list[float]:
        """Acceptance of draft position k given positions < k were accepted (NaN: never)."""
    def to_dict(self) -> dict[str, object]: ...

@final
class Speculator:
    """The engine's speculative loop over a native or Python target and drafter.

    ``target``: a ``NativeTarget`` or a Python object with the ``TargetModel`` protocol;
    ``drafter``: a ``Drafter`` or a Python object with the drafter protocol (checked natively).
    """

    def __init__(
        self,
        target: object,
        drafter: object,
        *,
        num_speculative_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        verify: str = "scheduled",
        threshold: float | None = None,
        steps_per_second: Sequence[tuple[int, float]] | None = None,
        steps_interpolation: str | None = None,
        record_confidence: bool = False,
        presence_penalty: object = None,
        frequency_penalty: object = None,
        repetition_penalty: object = None,
        logit_bias: object = None,
    ) -> None: ...
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        stop_token_ids: list[int] | None = None,
        on_round: Callable[[list[list[int]]], object] | None = None,
        seed: int | list[int] | None = None,
        target_only: bool = False,
    ) -> tuple[list[list[int]], SpeculationStats]:
        """Speculative decoding, or with ``target_only`` the target alone with the same options
        and seeds; ``(tokens per prompt, stats)``."""
    def warm_up(self, batch: object) -> None:
        """Profile the target for the scheduler now (``verify="scheduled"`` without a table)."""
    @property
    def num_speculative_tokens(self) -> int: ...
    @property
    def vocab_size(self) -> int:
        """The target's vocabulary (prompt and stop ids lie below it)."""

@final
class RequestUpdate:
    """One request's part of an engine step."""

    @property
    def request_id(self) -> int: ...
    @property
    def new_tokens(self) -> list[int]:
        """Tokens it committed in this step."""
    @property
    def logprobs(self) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """With ``logprobs`` asked for: per new token ``(token, logprob, [(id, logprob), ...])``,
        the alternatives most likely first (else empty)."""
    @property
    def drafted(self) -> int:
        """Drafts verified for it in this step."""
    @property
    def accepted(self) -> int:
        """Of those, accepted."""
    @property
    def finish_reason(self) -> str | None:
        """``None`` while it runs; ``"stop"``, ``"length"``, ``"aborted"`` or ``"error"`` when
        it ended."""
    @property
    def error(self) -> str | None:
        """With ``finish_reason == "error"``: why it failed (its rows only; the others ran on)."""
    @property
    def error_code(self) -> str | None:
        """With ``finish_reason == "error"``: the failure's stable code (``non-finite``, ...)."""
    @property
    def usage(self) -> dict[str, int | float]:
        """What it used so far (final when it finished)."""

@final
class Engine:
    """The serving engine (continuous batching) over a native or Python target and drafter."""

    def __init__(
        self,
        target: object,
        drafter: object,
        *,
        num_speculative_tokens: object = None,
        verify: str = "scheduled",
        threshold: float | None = None,
        steps_per_second: Sequence[tuple[int, float]] | None = None,
        steps_interpolation: str | None = None,
        record_confidence: bool = False,
        max_running: object = None,
        max_batched_tokens: object = None,
        kv_tokens: object = None,
        tokenizer_dir: object = None,
    ) -> None: ...
    def add_request(
        self,
        prompt: object,
        max_new_tokens: object,
        *,
        temperature: object = None,
        top_k: object = None,
        top_p: object = None,
        seed: object = None,
        stop_token_ids: object = None,
        max_drafts: object = None,
        logprobs: object = None,
        presence_penalty: object = None,
        frequency_penalty: object = None,
        repetition_penalty: object = None,
        logit_bias: object = None,
        response_format: str | None = None,
    ) -> int:
        """Queue a request; returns its id."""
    def step(self) -> list[RequestUpdate]:
        """One round over every running request, the GIL released."""
    def abort(self, request_id: object) -> None:
        """Abort a request (any thread); it ends at the next step."""
    def has_work(self) -> bool: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    def warm_up(self, batch: object) -> None:
        """Profile the target for the scheduler now (``verify="scheduled"`` without a table)."""
    def last_step_timing(self) -> dict[str, float | bool]:
        """Where the last step's time went (seconds): drafter, target, kernels, overhead,
        total; and whether it ran a round."""
    def metrics(self) -> dict[str, object]: ...
