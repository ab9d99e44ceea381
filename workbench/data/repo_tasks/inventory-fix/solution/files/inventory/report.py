"""Reports on a store."""

from __future__ import annotations

from .store import Store


def format_cents(cents: int) -> str:
    """Cents as dollars with two decimals: 1234 -> "$12.34", 105 -> "$1.05", -250 -> "-$2.50"."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}${cents // 100}.{cents % 100:02d}"


def total_value(store: Store) -> int:
    """The value of everything in the store, in cents."""
    return sum(item.total_cents() for item in store.items())


def summary(store: Store) -> str:
    """One line per item, sorted by SKU: "SKU  NAME  xQUANTITY  TOTAL", then "TOTAL  VALUE"."""
    lines = [f"{item.sku}  {item.name}  x{item.quantity}  {format_cents(item.total_cents())}"
             for item in store.items()]
    lines.append(f"TOTAL  {format_cents(total_value(store))}")
    return "\n".join(lines)
