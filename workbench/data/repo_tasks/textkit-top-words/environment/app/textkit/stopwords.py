"""English stopwords: words too common to say anything about a text."""

from __future__ import annotations

STOPWORDS = frozenset("""
a an and are as at be but by for from has have he her his i in is it its me my not of on or our she
so that the their them they this to was we were what when which who will with you your
""".split())


def is_stopword(word: str) -> bool:
    """Whether ``word`` (any case) is a stopword."""
    return word.lower() in STOPWORDS
