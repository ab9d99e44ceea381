"""Experimental trainer-side pieces measured by the benchmarks before they are wired into training."""
