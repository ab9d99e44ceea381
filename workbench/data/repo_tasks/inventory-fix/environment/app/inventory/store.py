"""The store: items by SKU."""

from __future__ import annotations

from .models import Item


class Store:
    """Items keyed by SKU."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        """Add a stock line. Adding a SKU the store already holds adds the new quantity to the
        existing line (the existing name and price are kept)."""
        existing = self._items.get(item.sku)
        if existing is None:
            self._items[item.sku] = Item(item.sku, item.name, item.unit_price_cents, item.quantity)
        else:
            existing.quantity = item.quantity

    def remove(self, sku: str, quantity: int) -> None:
        """Take ``quantity`` units of ``sku`` out of the store. Raises KeyError for an unknown SKU and
        ValueError when fewer than ``quantity`` units are held (nothing is removed then). A line whose
        quantity reaches 0 stays in the store."""
        existing = self._items[sku]
        existing.quantity -= quantity

    def get(self, sku: str) -> Item:
        """The line of ``sku`` (KeyError if unknown)."""
        return self._items[sku]

    def items(self) -> list[Item]:
        """Every line, sorted by SKU."""
        return sorted(self._items.values(), key=lambda item: item.sku)

    def low_stock(self, threshold: int) -> list[str]:
        """SKUs whose quantity is at or below ``threshold``, sorted."""
        return sorted(item.sku for item in self._items.values() if item.quantity < threshold)
