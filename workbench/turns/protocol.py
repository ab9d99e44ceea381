"""The tokenizer as this package uses it: a `Protocol` over the few members of a Hugging Face tokenizer the row
builders and views call, with HF's own (broad) return types, and helpers that narrow them.

    pad_id = token_id(tokenizer, "<|im_end|>")                 # an int, never a list
    text = decode_text(tokenizer, ids, skip_special_tokens=False)  # a str, never a list of str
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Tokenizer", "token_id", "decode_text"]


class Tokenizer(Protocol):
    """What is called on a tokenizer here (transformers' PreTrainedTokenizerBase satisfies it)."""

    @property
    def all_special_ids(self) -> list[int]: ...

    def __len__(self) -> int: ...

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: Any) -> str | list[str]: ...


def token_id(tokenizer: Tokenizer, token: str) -> int:
    """One token's id (HF returns a list only for a list of tokens)."""
    got = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(got, int):
        raise TypeError(f"the tokenizer gave {got!r} for the single token {token!r}")
    return got


def decode_text(tokenizer: Tokenizer, ids: Sequence[int], **kwargs: Any) -> str:
    """The text of one sequence of ids (HF returns a list of str only for a batch of sequences)."""
    text = tokenizer.decode(list(ids), **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"the tokenizer decoded one sequence to {type(text).__name__}, not str")
    return text
