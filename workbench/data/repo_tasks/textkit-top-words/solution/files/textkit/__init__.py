"""Small text utilities: a tokenizer, a stopword list and word statistics."""

from .stats import top_words, word_counts
from .stopwords import STOPWORDS, is_stopword
from .tokenize import words

__all__ = ["STOPWORDS", "is_stopword", "top_words", "word_counts", "words"]
