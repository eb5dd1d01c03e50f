"""Byte-level BPE tokenizer of the bundled pair, trained with ``tokenizers``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dspark.train.corpus import SEPARATOR

__all__ = ["encode_documents", "padded_vocab_size", "train_tokenizer"]


def padded_vocab_size(logical: int, multiple: int = 64) -> int:
    """Smallest multiple of ``multiple`` strictly above ``logical`` (leaves >= 1 padded row)."""
    return (logical // multiple + 1) * multiple


def train_tokenizer(texts: list[str], vocab_size: int, out: Path) -> object:
    """Train a byte-level BPE on ``texts`` and save ``out/tokenizer.json``; returns it.

    Deterministic for a given input (``tokenizers`` BPE training is).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[SEPARATOR],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return tok


def encode_documents(tok: object, texts: list[str]) -> np.ndarray:
    """One int32 stream: each document's ids followed by the separator id."""
    sep = tok.token_to_id(SEPARATOR)  # type: ignore[attr-defined]
    ids: list[int] = []
    for enc in tok.encode_batch(texts):  # type: ignore[attr-defined]
        ids.extend(enc.ids)
        ids.append(sep)
    return np.asarray(ids, dtype=np.int32)
