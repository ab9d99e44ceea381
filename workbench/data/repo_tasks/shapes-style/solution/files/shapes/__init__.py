"""Plane shapes and length units."""

from .geometry import Circle, Rectangle, total_area
from .units import parse_length, to_metres

__all__ = ["Circle", "Rectangle", "parse_length", "to_metres", "total_area"]
