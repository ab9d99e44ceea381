"""`python -m workbench ...` is the `workbench` command (works before the entry point is on PATH)."""

from .cli import main

main()
