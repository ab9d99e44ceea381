"""The item record."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Item:
    """A stock line: ``quantity`` units of one product at ``unit_price_cents`` each."""

    sku: str
    name: str
    unit_price_cents: int
    quantity: int = 0

    def __post_init__(self) -> None:
        if self.unit_price_cents < 0:
            raise ValueError(f"{self.sku}: a price cannot be negative")
        if self.quantity < 0:
            raise ValueError(f"{self.sku}: a quantity cannot be negative")

    def total_cents(self) -> int:
        """The value of the whole line in cents: unit price times quantity."""
        return self.unit_price_cents * self.quantity
