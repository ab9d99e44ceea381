"""Word statistics."""

from __future__ import annotations

from collections import Counter

from .stopwords import is_stopword
from .tokenize import words


def word_counts(text: str, skip_stopwords: bool = False) -> Counter[str]:
    """How often each word of ``text`` occurs (stopwords left out when ``skip_stopwords``)."""
    return Counter(w for w in words(text) if not (skip_stopwords and is_stopword(w)))


def top_words(text: str, n: int, skip_stopwords: bool = True) -> list[tuple[str, int]]:
    """The ``n`` most frequent words of ``text`` as (word, count), most frequent first, ties in
    alphabetical order; stopwords left out unless ``skip_stopwords`` is False."""
    if n <= 0:
        return []
    counts = word_counts(text, skip_stopwords=skip_stopwords)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
