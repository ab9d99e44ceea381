"""Shapes with an area and a perimeter."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Circle:
    """A circle of the given radius."""

    radius: float

    def area(self) -> float:
        """Pi times the radius squared."""
        return math.pi * self.radius ** 2

    def perimeter(self) -> float:
        """The circumference."""
        return 2 * math.pi * self.radius


@dataclass(frozen=True)
class Rectangle:
    """A rectangle of the given width and height."""

    width: float
    height: float

    def area(self) -> float:
        """Width times height."""
        return self.width * self.height

    def perimeter(self) -> float:
        """Twice width plus height."""
        return 2 * (self.width + self.height)

    def scaled(self, factor: float) -> "Rectangle":
        """This rectangle with both sides multiplied by ``factor``."""
        return Rectangle(self.width * factor, self.height * factor)


def total_area(shapes: Iterable[Circle | Rectangle]) -> float:
    """The sum of the shapes' areas."""
    total = 0.0
    for shape in shapes:
        total += shape.area()
    return total
