#!/bin/bash
# Grades /app with the held-out tests in /tests; judge.py writes /logs/verifier/reward.json.
cd /app
python -I -B /tests/judge.py
