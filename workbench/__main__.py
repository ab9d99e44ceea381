"""`python -m workbench ...` is the `workbench` command (works before the entry point is on PATH)."""

from workbench.cli import main

main()
