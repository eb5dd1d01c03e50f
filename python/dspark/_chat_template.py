"""The chat template the project's own pairs ship (the bundled pair, ``make-example`` and the
memory-bound pair): plain ``role: content`` lines and an ``assistant:`` cue, so that
``/v1/chat/completions`` works out of the box. The pairs are not trained for chat: the reply is
the model continuing the transcript, which is what a chat request on a base model gives."""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT_TEMPLATE", "tokenizer_config"]

#: Jinja, as ``tokenizer_config.json`` carries it (the server renders it with minijinja).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def tokenizer_config(eos: str | None, max_length: int) -> dict[str, Any]:
    """A ``tokenizer_config.json`` for a fast tokenizer used as it is (no BOS or EOS added)
    with :data:`CHAT_TEMPLATE`."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        "eos_token": eos,
        "pad_token": eos,
        "unk_token": None,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
