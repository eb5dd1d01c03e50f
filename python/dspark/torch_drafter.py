"""``dspark.torch_drafter``, kept importable: see :mod:`dspark.reference.torch_drafter`."""

from dspark.reference.torch_drafter import DTYPES, TorchDrafter, TorchDraftState

__all__ = ["DTYPES", "TorchDraftState", "TorchDrafter"]
