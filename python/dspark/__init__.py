"""dspark: a DSpark speculative-decoding core with a Rust engine.

The engine (config normalization, checkpoint rules, id mapping, sampling kernels) lives in the
native module ``dspark._native``; this package re-exports it and adds the torch-facing front.
"""

from dspark._native import (
    BackendError,
    CheckpointError,
    ConfigError,
    DraftSpec,
    DSparkError,
    IdMap,
    InputError,
    Report,
    VocabError,
    VocabLayout,
    __version__,
    inspect,
)
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

__all__ = [
    "BackendError",
    "CheckpointError",
    "ConfigError",
    "DSparkError",
    "DraftBlock",
    "DraftSpec",
    "IdMap",
    "InputError",
    "Report",
    "Verification",
    "VocabError",
    "VocabLayout",
    "__version__",
    "confidence",
    "inspect",
    "sample_block",
    "schedule_lengths",
    "schedule_pipelined",
    "schedule_threshold",
    "verify",
]
