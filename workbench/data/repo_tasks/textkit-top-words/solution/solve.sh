#!/bin/bash
# The oracle: top_words in stats.py, exported, and its test.
set -e
cp -r /solution/files/. /app/
cd /app && python -m unittest discover -s tests -q
