"""A small stock-keeping package: items, a store holding them, and reports on a store."""

from .models import Item
from .report import format_cents, summary, total_value
from .store import Store

__all__ = ["Item", "Store", "format_cents", "summary", "total_value"]
