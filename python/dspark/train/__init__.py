"""Training pipeline of the bundled tiny target + DSpark drafter pair (CPU, seeded).

Stages (``python -m dspark.train --help``): :mod:`.corpus` (CPython standard-library sources,
held-out split by file), :mod:`.tokenizer` (byte-level BPE), :mod:`.target` (a Qwen3 causal LM
trained from scratch), :mod:`.drafter_model` + :mod:`.objective` + :mod:`.drafter` (the DSpark
drafter trained on the target's own hidden states), :mod:`.confidence` (its confidence head
refitted alone for greedy serving, on text neither model saw). Needs ``torch``,
``transformers`` and ``tokenizers``; nothing is downloaded.
"""
