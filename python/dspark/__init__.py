"""dspark: a DSpark speculative-decoding core with a Rust engine.

The engine (config normalization, checkpoint rules, id mapping, sampling kernels) lives in the
native module ``dspark._native``; this package re-exports it and adds the torch-facing front.
"""

from dspark._cuda_libs import preload_cuda_libraries
from dspark._native import (
    BackendError,
    CheckpointError,
    ConfigError,
    DraftSpec,
    DSparkError,
    IdMap,
    InputError,
    InternalError,
    Report,
    VocabError,
    VocabLayout,
    __version__,
    build_info,
    inspect,
)
from dspark._threads import ensure_rayon_threads
from dspark.drafter import Drafter, DraftState
from dspark.kernels import (
    DraftBlock,
    Verification,
    confidence,
    sample_block,
    schedule_lengths,
    schedule_pipelined,
    schedule_threshold,
    verify,
)
from dspark.native_target import NativeTarget

# Before the engine's first parallel op or matmul (see dspark._threads).
ensure_rayon_threads()
# The CUDA build finds cuBLAS, cuRAND and NVRTC in NVIDIA's wheels (see dspark._cuda_libs).
preload_cuda_libraries()

# The torch-facing front imports torch: loaded on first use so numpy-only installs still work.
_TORCH_EXPORTS = {
    "DraftProposal": "dspark.protocols",
    "DrafterProtocol": "dspark.protocols",
    "Engine": "dspark.engine",
    "GenerationResult": "dspark.speculator",
    "HFTarget": "dspark.target",
    "RequestUpdate": "dspark.engine",
    "SpeculationStats": "dspark.speculator",
    "Speculator": "dspark.speculator",
    "TargetModel": "dspark.protocols",
    "TorchDrafter": "dspark.reference.torch_drafter",
}


def __getattr__(name: str) -> object:
    module = _TORCH_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dspark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "BackendError",
    "CheckpointError",
    "ConfigError",
    "DSparkError",
    "DraftBlock",
    "DraftProposal",
    "DraftSpec",
    "DraftState",
    "Drafter",
    "DrafterProtocol",
    "Engine",
    "GenerationResult",
    "HFTarget",
    "IdMap",
    "InputError",
    "InternalError",
    "NativeTarget",
    "Report",
    "RequestUpdate",
    "SpeculationStats",
    "Speculator",
    "TargetModel",
    "TorchDrafter",
    "Verification",
    "VocabError",
    "VocabLayout",
    "__version__",
    "build_info",
    "confidence",
    "inspect",
    "sample_block",
    "schedule_lengths",
    "schedule_pipelined",
    "schedule_threshold",
    "verify",
]
