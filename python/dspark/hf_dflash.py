"""``dspark.hf_dflash``: kept importable; the module is :mod:`dspark.reference.hf_dflash`."""

from dspark.reference.hf_dflash import to_hf_dflash

__all__ = ["to_hf_dflash"]
