#!/usr/bin/env bash
# The GPU path on the lent H200, in one device command (run from the repository root there, $OUT set by the tool):
#   1. TRL 1.16 and what its import needs beside the image (datasets, dill, multiprocess; peft pinned to ours),
#      carried as wheels in .devcarry/whl (datasets 4.7.0 in .devcarry/whl-ds4 if 5.2.0 does not import there);
#   2. the tiny asset, carried xz-compressed in .devcarry/tiny (byte-identical to `workbench assets build tiny`);
#   3. `workbench train --from-rollouts` on CUDA with the tiny asset on the shipped SmolLM2 captures (2 steps);
#   4. benchmarks/gpu_trl_step.py (random-init Qwen3-0.6B shape, 4 rows of 16,384 tokens).
# Prepared here (see benchmarks/README.md, section 7):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .devcarry/whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 \
#     multiprocess==0.70.19 peft==0.21.2;  pip download --no-deps -d .devcarry/whl-ds4 datasets==4.7.0
#   xz -6 -c .cache/assets/tiny/model.safetensors > .devcarry/tiny/model.safetensors.xz  (tokenizer.json likewise;
#   config.json, tokenizer_config.json, chat_template.jinja, manifest.json copied)
set -o pipefail
rm -rf /tmp/site /tmp/wbcache /tmp/wbruns /tmp/rec /tmp/tinyrun  # a warm device keeps /tmp
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devcarry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD TRL_EXPERIMENTAL_SILENCE=1 WORKBENCH_CACHE=/tmp/wbcache WORKBENCH_RUNS=/tmp/wbruns
if ! python3 -c "import datasets, trl.trainer.grpo_trainer" 2>$OUT/datasets52.err; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devcarry/whl-ds4/*.whl || exit 1
fi
A=/tmp/wbcache/assets/tiny; mkdir -p $A && cp .devcarry/tiny/*.json .devcarry/tiny/*.jinja $A/
python3 -c "import lzma,shutil,sys
for n in ('model.safetensors','tokenizer.json'):
    shutil.copyfileobj(lzma.open(f'.devcarry/tiny/{n}.xz'), open(f'$A/{n}','wb'))"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch,transformers,trl,peft,datasets,pyarrow,accelerate,triton; print('torch',torch.__version__,'transformers',transformers.__version__,'trl',trl.__version__,'peft',peft.__version__,'datasets',datasets.__version__,'pyarrow',pyarrow.__version__,'accelerate',accelerate.__version__,'triton',triton.__version__)"; } 2>&1 | tee $OUT/env.txt
mkdir -p /tmp/rec/shipped && cp -r workbench/data/rollouts/smollm2-easy workbench/data/rollouts/smollm2-fork-bpe workbench/data/rollouts/smollm2-fork-invalid /tmp/rec/shipped/
t0=$SECONDS
python3 -m workbench train --from-rollouts /tmp/rec --temperature 0.5 --steps 2 --group-size 2 --tasks-per-step 3 \
  --model tiny --device ${DEVICE:-cuda} --out /tmp/tinyrun > $OUT/tiny_cli.log 2>&1; echo "tiny cli rc=$? in $((SECONDS-t0)) s" | tee -a $OUT/env.txt
tail -c 3000 $OUT/tiny_cli.log; cp /tmp/tinyrun/metrics.jsonl $OUT/tiny_metrics.jsonl; cp /tmp/tinyrun/summary.json $OUT/tiny_summary.json
PYTHONUNBUFFERED=1 timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/gpu_trl_step.py --device ${DEVICE:-cuda} --asset-dir $A --out $OUT/gpu_trl_step.json "$@" 2>&1 \
  | grep -v -e Warning -e warnings.warn -e "it/s]" > $OUT/gpu_trl_step.log; echo "bench rc=$?"; grep '^{' $OUT/gpu_trl_step.log
