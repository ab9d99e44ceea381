"""Tests of the inventory package: python -m unittest -v"""

import unittest

from inventory import Item, Store, format_cents, summary, total_value


def sample() -> Store:
    store = Store()
    store.add(Item("B-2", "bolt", 25, 40))
    store.add(Item("A-1", "anchor", 1250, 2))
    return store


class ItemTests(unittest.TestCase):
    def test_total(self):
        self.assertEqual(Item("X", "x", 300, 3).total_cents(), 900)

    def test_negative_price(self):
        with self.assertRaises(ValueError):
            Item("X", "x", -1, 1)


class StoreTests(unittest.TestCase):
    def test_items_sorted(self):
        self.assertEqual([i.sku for i in sample().items()], ["A-1", "B-2"])

    def test_add_same_sku_adds_quantity(self):
        store = sample()
        store.add(Item("B-2", "bolt", 25, 10))
        self.assertEqual(store.get("B-2").quantity, 50)

    def test_remove(self):
        store = sample()
        store.remove("B-2", 15)
        self.assertEqual(store.get("B-2").quantity, 25)

    def test_low_stock(self):
        self.assertEqual(sample().low_stock(5), ["A-1"])


class ReportTests(unittest.TestCase):
    def test_format(self):
        self.assertEqual(format_cents(1234), "$12.34")

    def test_total_value(self):
        self.assertEqual(total_value(sample()), 40 * 25 + 2 * 1250)

    def test_summary_last_line(self):
        self.assertEqual(summary(sample()).splitlines()[-1], "TOTAL  $35.00")


if __name__ == "__main__":
    unittest.main()
