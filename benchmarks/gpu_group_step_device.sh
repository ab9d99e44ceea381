#!/usr/bin/env bash
# The FlexAttention group step on the lent H200, in one device command (run from the repository root there, $OUT set by the tool;
# carry: .devcarry/site.tar.xz .devcarry/tiny):
#   1. TRL 1.16 and what its import needs beside the image (datasets, dill, multiprocess; peft pinned to ours),
#      and openenv 0.10.0 (workbench._compat checks its version on import), carried as ONE xz tarball of the
#      unpacked wheels (1.75 MB): the tracked tree is 63.7 MB of the 64 MiB that travels, so the six wheels
#      (3.4 MB) did not fit beside the tokenizer;
#   2. the tiny asset's tokenizer without its BPE merges (0.75 MB xz instead of 1.88): the runs pass their own
#      random-init model and random token ids, so only the tokenizer's vocabulary, special ids and decoding are
#      used, and those are the asset's (same length 151,665, eos/pad, decode checked equal here);
#   3. the CUDA test of tests/test_group_flex.py (compiled FlexAttention forward + backward vs the per-row path);
#   4. benchmarks/gpu_group_step.py with the arguments given to this script.
# Prepared here:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .devcarry/whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 \
#     multiprocess==0.70.19 peft==0.21.2 openenv==0.10.0
#   mkdir site; for w in .devcarry/whl/*.whl; do unzip -q $w -d site; done; tar -C site -cf - . | xz -9e > .devcarry/site.tar.xz
#   mkdir .devcarry/tiny; cp .cache/assets/tiny/{*.json,*.jinja} .devcarry/tiny/; rm .devcarry/tiny/tokenizer.json
#   python3 -c "import json,lzma; t=json.load(open('.cache/assets/tiny/tokenizer.json')); t['model']['merges']=[]
#     json.dump(t, lzma.open('.devcarry/tiny/tokenizer.json.xz','wt',preset=9), ensure_ascii=False)"
set -o pipefail
rm -rf /tmp/site /tmp/wbcache /tmp/gpu_group_step && mkdir -p /tmp/site  # a warm device keeps /tmp
tar -xJf .devcarry/site.tar.xz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD TRL_EXPERIMENTAL_SILENCE=1 WORKBENCH_CACHE=/tmp/wbcache WORKBENCH_RUNS=/tmp/wbruns
A=/tmp/wbcache/assets/tiny; mkdir -p $A && cp .devcarry/tiny/*.json .devcarry/tiny/*.jinja $A/
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.devcarry/tiny/tokenizer.json.xz'), open('$A/tokenizer.json','wb'))"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch,transformers,trl,peft,datasets,triton; print('torch',torch.__version__,'transformers',transformers.__version__,'trl',trl.__version__,'peft',peft.__version__,'datasets',datasets.__version__,'triton',triton.__version__)"; } 2>&1 | tee $OUT/env.txt
t0=$SECONDS
timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests/test_group_flex.py -k cuda -q -s -p no:cacheprovider > $OUT/pytest_cuda.log 2>&1
echo "pytest rc=$? in $((SECONDS-t0)) s" | tee -a $OUT/env.txt; grep -E "passed|failed|error|floor" $OUT/pytest_cuda.log | tail -5
t0=$SECONDS
PYTHONUNBUFFERED=1 TORCH_LOGS=recompiles timeout ${BENCH_TIMEOUT:-420} python3 benchmarks/gpu_group_step.py --asset-dir $A \
  --out $OUT/gpu_group_step.json "$@" 2>&1 | grep -v -e Warning -e warnings.warn -e "it/s]" > $OUT/gpu_group_step.log
echo "bench rc=$? in $((SECONDS-t0)) s" | tee -a $OUT/env.txt; grep -e '^{' -e Recompiling $OUT/gpu_group_step.log | cut -c1-400
