"""The SentencePiece form of a byte-level BPE ``tokenizer.json`` (a ``tokenizer.model`` file).

Some converters read a target's vocabulary only through SentencePiece: llama.cpp's
``convert_hf_to_gguf.py`` takes ``tokenizer.model`` when it exists (its Qwen2/Qwen3 path tries
SentencePiece first) and otherwise accepts a BPE ``tokenizer.json`` only when a hash of its
output on a fixed text is one the converter already knows, which a tokenizer of our own never
is. This module writes the same vocabulary as a SentencePiece ``ModelProto`` (protobuf, encoded
by hand: no dependency): every id keeps its token, so ids and decoded text are the same in both
files.

* id ``i`` of the BPE vocabulary is piece ``i``; the tokens in ``added_tokens`` are ``CONTROL``;
* a single byte is a ``BYTE`` piece ``<0xXX>`` (SentencePiece's byte fallback), except the
  space, which is the ``NORMAL`` piece ``▁`` (SentencePiece writes spaces as ``▁`` before it
  merges, and llama.cpp would otherwise spell a lone space as the three bytes of ``▁``);
* a merged token is ``NORMAL``, its text with spaces written ``▁``; its score is
  ``-(merge rank + 1)``, so SentencePiece's highest-score-first merging applies the merges in
  the BPE's order;
* after the vocabulary come the two pieces SentencePiece requires and the vocabulary lacks:
  ``<unk>`` (``UNKNOWN``, id ``n``) and ``<0x20>`` (``BYTE``, id ``n + 1``: byte fallback needs
  all 256). No text encodes to them (every byte has a piece, and spaces are ``▁``), and
  converters that size the vocabulary from the model config (``vocab_size = n``) drop them.

What differs is the splitting of text: SentencePiece has no pre-tokenizer, so it can merge across
the boundaries the byte-level pre-tokenizer's regex puts between words, digits, punctuation and
whitespace runs. Tokenizing text through this file can therefore give other (equally decodable)
ids than ``tokenizer.json``; feed token ids to compare models exactly.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, NoReturn

from dspark._errors import raise_error
from dspark._native import InputError

__all__ = ["sentencepiece_model"]

# sentencepiece_model.proto field numbers and enum values.
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
_BPE = 2
_SPACE = "\u2581"


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32 fields are 10-byte two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, value: bytes) -> bytes:
    return _varint((field << 3) | 2) + _varint(len(value)) + value


def _float(field: int, value: float) -> bytes:
    return _varint((field << 3) | 5) + struct.pack("<f", value)


def _piece(text: str, score: float, kind: int, texts: list[str]) -> bytes:
    texts.append(text)
    return _bytes(1, text.encode()) + _float(2, score) + _int(3, kind)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: symbol -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[str, int] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _bad(message: str) -> NoReturn:
    raise_error(InputError, "invalid-argument", f"tokenizer.json: {message}")


def sentencepiece_model(tokenizer: Mapping[str, Any]) -> bytes:
    """The serialized SentencePiece ``ModelProto`` of a byte-level BPE ``tokenizer.json``
    (parsed), as described in the module docstring. Deterministic."""
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE" or (tokenizer.get("pre_tokenizer") or {}).get("type") != (
        "ByteLevel"
    ):
        _bad("expected a BPE model with a ByteLevel pre-tokenizer")
    vocab: dict[str, int] = dict(model["vocab"])
    special = {str(t["content"]) for t in tokenizer.get("added_tokens") or []}
    size = len(vocab)
    if sorted(vocab.values()) != list(range(size)):
        _bad("vocabulary ids are not 0..n-1")
    ranks: dict[str, int] = {}
    for rank, merge in enumerate(model.get("merges") or []):
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        ranks.setdefault(a + b, rank)
    decode = _byte_decoder()
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    pieces = []
    texts: list[str] = []
    for token, _ in by_id:
        if token in special:
            pieces.append(_piece(token, 0.0, _CONTROL, texts))
            continue
        try:
            raw = bytes(decode[c] for c in token)
        except KeyError:
            _bad(f"token {token!r} is not byte-level")
        if len(raw) == 1:
            b = raw[0]
            if b == 0x20:
                pieces.append(_piece(_SPACE, 0.0, _NORMAL, texts))
            else:
                pieces.append(_piece(f"<0x{b:02X}>", 0.0, _BYTE, texts))
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            _bad(f"token {token!r} is not whole UTF-8 characters (SentencePiece cannot hold it)")
        if token not in ranks:
            _bad(f"token {token!r} is not made by any merge")
        pieces.append(_piece(text.replace(" ", _SPACE), -float(ranks[token] + 1), _NORMAL, texts))
    pieces.append(_piece("<unk>", 0.0, _UNKNOWN, texts))
    pieces.append(_piece("<0x20>", 0.0, _BYTE, texts))
    if len(set(texts)) != len(texts) or sum(t.startswith("<0x") for t in texts) != 256:
        _bad("not one SentencePiece piece per token and per byte")
    trainer = (
        _int(3, _BPE)
        + _int(4, len(pieces))
        + _int(35, 1)  # byte_fallback
        + _int(40, size)  # unk_id
        + _int(41, -1)  # bos_id
        + _int(42, -1)  # eos_id
        + _int(43, -1)  # pad_id
    )
    normalizer = (
        _bytes(1, b"identity")
        + _int(3, 0)  # add_dummy_prefix
        + _int(4, 0)  # remove_extra_whitespaces
        + _int(5, 1)  # escape_whitespaces
    )
    return b"".join(_bytes(1, p) for p in pieces) + _bytes(2, trainer) + _bytes(3, normalizer)
