"""The judge: runs the held-out tests (/tests/hidden_*.py) against /app and writes the reward.

    python -I -B /tests/judge.py [--style PACKAGE]

The tests run in a child process (``python -m unittest`` in /app, as the agent runs its own); this
process never imports the workspace's code and writes /logs/verifier/reward.json last, after the
child is gone. With ``--style``, /tests/check_style.py must also find no problem in /app/PACKAGE (it
parses the files, never imports them).

reward.json: {"reward": 1.0 when every test passes (and the style is clean) else 0.0,
"tests_passed": n, "tests_total": m, "style_problems": k}.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 45  # task.toml gives test.sh 60 s in all


def main(argv: list[str]) -> None:
    try:
        run = subprocess.run([sys.executable, "-B", "-m", "unittest", "discover", "-v", "-s", "/tests", "-p",
                              "hidden_*.py", "-t", "/tests"], cwd="/app", capture_output=True, text=True,
                             timeout=TIMEOUT_S, check=False)
        output, code = run.stderr, run.returncode
    except subprocess.TimeoutExpired:
        output, code = f"the tests ran past {TIMEOUT_S} s", 1
    sys.stdout.write(output[-4000:] + "\n")
    ran = re.search(r"^Ran (\d+) tests?", output, re.MULTILINE)
    total = int(ran.group(1)) if ran else 0
    failed = re.search(r"^FAILED \((.*)\)$", output, re.MULTILINE)
    bad = sum(int(n) for n in re.findall(r"\d+", failed.group(1))) if failed else (0 if code == 0 else total)
    metrics = {"tests_passed": max(0, total - bad), "tests_total": total}
    style_ok = True
    if "--style" in argv:
        sys.path.insert(0, "/tests")
        from check_style import check

        problems = check(Path("/app") / argv[argv.index("--style") + 1])
        sys.stdout.write("".join(p + "\n" for p in problems) or "style: no problems\n")
        metrics["style_problems"] = len(problems)
        style_ok = not problems
    passed = code == 0 and total > 0 and bad == 0 and style_ok
    with open("/logs/verifier/reward.json", "w") as f:
        json.dump({"reward": 1.0 if passed else 0.0, **metrics}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
