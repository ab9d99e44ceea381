"""Tests of the shapes package: python -m unittest -v"""

import math
import unittest

from shapes import Circle, Rectangle, parse_length, to_metres, total_area


class GeometryTests(unittest.TestCase):
    def test_circle(self):
        self.assertAlmostEqual(Circle(2).area(), 4 * math.pi)

    def test_rectangle(self):
        self.assertEqual(Rectangle(2, 3).perimeter(), 10)

    def test_total_area(self):
        self.assertAlmostEqual(total_area([Rectangle(1, 2), Rectangle(3, 1)]), 5)


class UnitTests(unittest.TestCase):
    def test_to_metres(self):
        self.assertAlmostEqual(to_metres(12, "in"), 0.3048)

    def test_parse(self):
        self.assertAlmostEqual(parse_length("2.5 km"), 2500)
        self.assertIsNone(parse_length("3 parsecs"))


if __name__ == "__main__":
    unittest.main()
