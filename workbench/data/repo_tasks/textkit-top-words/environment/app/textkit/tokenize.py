"""The tokenizer: text to lower-case words."""

from __future__ import annotations

import re

# A word is a run of letters, possibly with apostrophes inside it ("don't", "o'clock"); digits and
# other characters separate words.
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


def words(text: str) -> list[str]:
    """The words of ``text``, lower-cased, in order: "Don't STOP-me, 2 times!" -> ["don't", "stop", "me", "times"]."""
    return _WORD.findall(text.lower())
