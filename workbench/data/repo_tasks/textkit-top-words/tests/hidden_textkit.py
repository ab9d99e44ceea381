"""Held-out tests of textkit.top_words, and of the test the agent was asked to add."""

import ast
import subprocess
import sys
import unittest

TEXT = "The cat sat. The cat ran! A dog sat; the DOG didn't run, it's late. Cat?"


class TopWordsTests(unittest.TestCase):
    def test_exported(self):
        import textkit

        self.assertTrue(callable(getattr(textkit, "top_words", None)))
        from textkit.stats import top_words

        self.assertIs(textkit.top_words, top_words)

    def test_order_and_ties(self):
        from textkit import top_words

        self.assertEqual(top_words(TEXT, 3), [("cat", 3), ("dog", 2), ("sat", 2)])

    def test_stopwords(self):
        from textkit import top_words

        self.assertEqual(top_words(TEXT, 2, skip_stopwords=False), [("cat", 3), ("the", 3)])
        self.assertEqual(top_words("the the the a", 5), [])

    def test_tokenizer_reused(self):
        from textkit import top_words

        self.assertEqual(top_words("Didn't didn't DIDN'T 42 x2", 2), [("didn't", 3), ("x", 1)])

    def test_n(self):
        from textkit import top_words

        self.assertEqual(top_words(TEXT, 0), [])
        self.assertEqual(top_words(TEXT, -1), [])
        self.assertEqual(len(top_words(TEXT, 100)), 8)
        self.assertIsInstance(top_words(TEXT, 1)[0], tuple)


class AgentTestTests(unittest.TestCase):
    def test_agent_added_test_top_words(self):
        with open("/app/tests/test_textkit.py", encoding="utf-8") as f:
            tree = ast.parse(f.read())
        stats = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StatsTests"]
        self.assertTrue(stats, "tests/test_textkit.py has no StatsTests class")
        names = {n.name for n in stats[0].body if isinstance(n, ast.FunctionDef)}
        self.assertIn("test_top_words", names)
        method = next(n for n in stats[0].body if isinstance(n, ast.FunctionDef) and n.name == "test_top_words")
        self.assertIn("top_words", ast.dump(method).replace("test_top_words", ""))

    def test_suite_passes(self):
        run = subprocess.run([sys.executable, "-B", "-m", "unittest", "discover", "-s", "tests"], cwd="/app",
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr[-500:])
        self.assertRegex(run.stderr, r"Ran [5-9]|Ran [1-9][0-9]")


if __name__ == "__main__":
    unittest.main()
