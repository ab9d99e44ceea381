#!/bin/bash
# The oracle: the package with every style problem fixed, behaviour unchanged.
set -e
cp -r /solution/files/. /app/
cd /app && python tools/check_style.py shapes && python -m unittest -q
