# Sandbox start before and after "the checkout anywhere" (one bubblewrap as the sandbox uid -> an outer
# bubblewrap as root + an inner one as the uid), back to back, twice, on the same quiet machine.
# Before = main at d58e193 in a worktree (its benchmark given the same 0755 temp folder fix):
#   git worktree add /tmp/wb-base d58e193 && chmod 700 /tmp/wb-base/workbench/data /tmp/wb-base/runs
cd "$(git rev-parse --show-toplevel)"
for round in 1 2; do
  OMP_NUM_THREADS=1 .venv/bin/python /tmp/wb-base/benchmarks/sandbox_lifecycle.py --sessions 50
  cp /tmp/wb-base/benchmarks/results/sandbox_lifecycle.json benchmarks/results/sandbox_layout/before_$round.json
  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sandbox_lifecycle.py --sessions 50 --out benchmarks/results/sandbox_layout/after_$round.json
done
