"""Tests of textkit: python -m unittest discover -s tests -v"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from textkit import is_stopword, top_words, word_counts, words  # noqa: E402


class TokenizeTests(unittest.TestCase):
    def test_words(self):
        self.assertEqual(words("Don't STOP-me, 2 times!"), ["don't", "stop", "me", "times"])


class StopwordTests(unittest.TestCase):
    def test_is_stopword(self):
        self.assertTrue(is_stopword("The"))
        self.assertFalse(is_stopword("kettle"))


class StatsTests(unittest.TestCase):
    def test_word_counts(self):
        self.assertEqual(word_counts("the cat and the hat")["the"], 2)

    def test_word_counts_skip_stopwords(self):
        self.assertNotIn("the", word_counts("the cat and the hat", skip_stopwords=True))

    def test_top_words(self):
        self.assertEqual(top_words("b x b c x b the the the", 2), [("b", 3), ("x", 2)])
        self.assertEqual(top_words("the the cat", 1, skip_stopwords=False), [("the", 2)])
        self.assertEqual(top_words("cat", 0), [])


if __name__ == "__main__":
    unittest.main()
