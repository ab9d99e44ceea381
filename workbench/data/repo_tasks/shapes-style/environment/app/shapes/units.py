"""Lengths with units: "3cm", "2.5 m", "12 in"."""

from __future__ import annotations

import re
import sys

FACTORS = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048}
_LENGTH = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def to_metres(value: float, unit: str) -> float:
    """``value`` in ``unit`` as metres (KeyError for an unknown unit)."""
    return value * FACTORS[unit]


def parse_length(text):
    """A length like "3cm" or "2.5 m" in metres; None when the text is not a length with a known unit."""
    m = _LENGTH.fullmatch(text)
    if not m:
        return None
    try:
        return to_metres(float(m.group(1)), m.group(2))
    except:
        return None
