"""Held-out tests of the shapes package: its behaviour, unchanged by the style fixes."""

import contextlib
import io
import math
import unittest

import shapes
from shapes import Circle, Rectangle, parse_length, to_metres, total_area


class GeometryTests(unittest.TestCase):
    def test_circle(self):
        self.assertAlmostEqual(Circle(1.5).area(), math.pi * 2.25)
        self.assertAlmostEqual(Circle(1.5).perimeter(), 3 * math.pi)

    def test_rectangle(self):
        r = Rectangle(2, 5)
        self.assertEqual((r.area(), r.perimeter()), (10, 14))
        self.assertEqual(r.scaled(1.5), Rectangle(3.0, 7.5))

    def test_total_area_returns_and_prints_nothing(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            total = total_area([Rectangle(1, 2), Circle(1)])
        self.assertAlmostEqual(total, 2 + math.pi)
        self.assertEqual(out.getvalue(), "")
        self.assertEqual(total_area([]), 0.0)
        self.assertAlmostEqual(total_area(iter([Rectangle(1, 1)])), 1.0)


class UnitTests(unittest.TestCase):
    def test_to_metres(self):
        self.assertAlmostEqual(to_metres(3, "ft"), 0.9144)
        with self.assertRaises(KeyError):
            to_metres(1, "parsec")

    def test_parse_length(self):
        self.assertAlmostEqual(parse_length("3cm"), 0.03)
        self.assertAlmostEqual(parse_length(" -2.5 m "), -2.5)
        self.assertIsNone(parse_length("3 parsecs"))
        self.assertIsNone(parse_length("three metres"))


class ApiTests(unittest.TestCase):
    def test_exports(self):
        self.assertEqual(sorted(shapes.__all__), ["Circle", "Rectangle", "parse_length", "to_metres", "total_area"])


if __name__ == "__main__":
    unittest.main()
