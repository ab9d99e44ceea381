"""Shapes with an area and a perimeter."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Circle:
    """A circle of the given radius."""

    radius: float

    def area(self) -> float:
        return math.pi * self.radius ** 2

    def perimeter(self):
        """The circumference."""
        return 2 * math.pi * self.radius


@dataclass(frozen=True)
class Rectangle:
    width: float
    height: float

    def area(self) -> float:
        """Width times height."""
        return self.width * self.height

    def perimeter(self) -> float:
        """Twice width plus height."""
        return 2 * (self.width + self.height)

    def scaled(self, factor) -> "Rectangle":
        """This rectangle with both sides multiplied by ``factor``."""
        return Rectangle(self.width * factor, self.height * factor)


def total_area(shapes):
    """The sum of the shapes' areas."""
    total = 0.0
    for shape in shapes:
        total += shape.area()
    print(f"total area of {len(shapes)} shapes: {total}")
    return total
