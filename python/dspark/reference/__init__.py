"""Plain-torch implementations the engine is tested against, and the HF bridges.

- :mod:`dspark.reference.torch_drafter`: ``TorchDrafter``, the DSpark drafter in plain torch
  (``dspark.TorchDrafter``), with ``torch_ops`` (its operations) and ``torch_loading`` (its
  weights);
- :mod:`dspark.reference.hf_dflash`: a drafter backbone run by HF transformers' DFlash
  assisted generation.

They need torch (and transformers for ``hf_dflash``); nothing in the engine's path imports them.
"""
