"""harness-workbench."""
