"""The transformers KV-cache argument, across the versions dspark supports (>= 4.50, 5.x).

A causal LM's ``forward`` takes its cache as ``past_key_values`` in transformers 4 and in the
5.x releases that kept that name; releases that call it ``cache`` may still accept
``past_key_values`` as a deprecated alias that warns. So the rule is: pass ``cache`` when the
model's ``forward`` names it, else ``past_key_values``. Outputs follow the same rule: read
``cache`` when the output has it, else ``past_key_values``.

One implementation, used by :class:`dspark.HFTarget` and by the target-only baseline
(:mod:`dspark.measure`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["cache_kwarg", "output_cache"]


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its KV cache by: ``cache`` or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned: ``output.cache`` when set, else ``past_key_values``."""
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else output.past_key_values
