# The two commands a newcomer needs (README): `make run` and `make test`. Both set up first.
.PHONY: setup run test lab

setup:
	scripts/setup.sh

run: setup
	OMP_NUM_THREADS=1 .venv/bin/python -m workbench notebooks run --params default

test: setup
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest

lab: setup
	.venv/bin/python -m jupyter lab notebooks/
