"""Word statistics."""

from __future__ import annotations

from collections import Counter

from .stopwords import is_stopword
from .tokenize import words


def word_counts(text: str, skip_stopwords: bool = False) -> Counter[str]:
    """How often each word of ``text`` occurs (stopwords left out when ``skip_stopwords``)."""
    return Counter(w for w in words(text) if not (skip_stopwords and is_stopword(w)))
