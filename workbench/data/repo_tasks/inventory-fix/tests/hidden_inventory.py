"""Held-out tests of the inventory package: the documented behaviour of every function."""

import unittest

from inventory import Item, Store, format_cents, summary, total_value


def sample() -> Store:
    store = Store()
    store.add(Item("C-3", "clamp", 899, 3))
    store.add(Item("A-1", "anchor", 1250, 2))
    store.add(Item("B-2", "bolt", 5, 40))
    return store


class ItemTests(unittest.TestCase):
    def test_total(self):
        self.assertEqual(Item("X", "x", 899, 3).total_cents(), 2697)

    def test_rejects_negative(self):
        for args in (("X", "x", -1, 1), ("X", "x", 1, -1)):
            with self.assertRaises(ValueError):
                Item(*args)


class StoreTests(unittest.TestCase):
    def test_add_merges_quantity_keeps_first_line(self):
        store = sample()
        store.add(Item("B-2", "other name", 7, 10))
        line = store.get("B-2")
        self.assertEqual((line.name, line.unit_price_cents, line.quantity), ("bolt", 5, 50))

    def test_add_copies_the_item(self):
        store, item = Store(), Item("Z", "z", 1, 1)
        store.add(item)
        store.add(Item("Z", "z", 1, 2))
        self.assertEqual(item.quantity, 1)
        self.assertEqual(store.get("Z").quantity, 3)

    def test_remove(self):
        store = sample()
        store.remove("B-2", 40)
        self.assertEqual(store.get("B-2").quantity, 0)
        self.assertIn("B-2", [i.sku for i in store.items()])

    def test_remove_too_many_changes_nothing(self):
        store = sample()
        with self.assertRaises(ValueError):
            store.remove("A-1", 3)
        self.assertEqual(store.get("A-1").quantity, 2)

    def test_remove_unknown(self):
        with self.assertRaises(KeyError):
            sample().remove("Q-9", 1)

    def test_low_stock_at_or_below(self):
        self.assertEqual(sample().low_stock(3), ["A-1", "C-3"])
        self.assertEqual(sample().low_stock(1), [])

    def test_items_sorted(self):
        self.assertEqual([i.sku for i in sample().items()], ["A-1", "B-2", "C-3"])


class ReportTests(unittest.TestCase):
    def test_format_cents(self):
        cases = {1234: "$12.34", 105: "$1.05", 5: "$0.05", 0: "$0.00", -250: "-$2.50", 100000: "$1000.00"}
        for cents, text in cases.items():
            self.assertEqual(format_cents(cents), text)

    def test_total_value(self):
        self.assertEqual(total_value(sample()), 3 * 899 + 2 * 1250 + 40 * 5)

    def test_summary(self):
        self.assertEqual(summary(sample()).splitlines(), [
            "A-1  anchor  x2  $25.00", "B-2  bolt  x40  $2.00", "C-3  clamp  x3  $26.97", "TOTAL  $53.97"])


if __name__ == "__main__":
    unittest.main()
