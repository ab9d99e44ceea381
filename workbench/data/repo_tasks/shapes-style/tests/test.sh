#!/bin/bash
# Grades /app: the held-out behaviour tests in /tests and the held-out copy of the style check;
# judge.py writes /logs/verifier/reward.json.
cd /app
python -I -B /tests/judge.py --style shapes
