"""JSON on the capture proxy's hot path: orjson where it reads and writes what the json module would, json elsewhere.

Every streamed model call is parsed and re-encoded on its way through the proxy: the harness's request (30 KB for
opencode's agent call) is parsed, checked and re-encoded for the engine, and every engine chunk is parsed, folded
into the turn and re-encoded for the harness; the first chunk carries the prompt's ids (7,097 for that call, 32 KB).
On the 2-core AMD EPYC of benchmarks/README.md (section 1) the json module took 78 us to read the request, 146 us
to write it and 549 us to read the first chunk; this module 72, 7 and 225 us (orjson 28, 7 and 125; the rest is
the check for long digit runs below).

orjson is not the json module, so each place they differ goes to the json module, and a value read here is the
value ``json.loads`` gives:

- orjson reads an integer beyond 64 bits as a float (json: the exact int, which a chat template then renders
  digit for digit): text holding a run of 19 or more digits is read by json (an int of 18 digits always fits);
- orjson refuses NaN and Infinity, numbers beyond the float range, lone surrogate escapes, a byte-order mark and
  UTF-16/32 text, all of which json reads: they are read by json (which refuses the rest with its own error);
- orjson writes a non-finite float as ``null`` (json: ``NaN``), refuses integers beyond 64 bits, lone surrogates
  and keys that are not strings: `dumps` uses orjson only for a value `loads` read with orjson (``fast``; such a
  value has no non-finite float) and edited with finite numbers, and falls back to json when orjson refuses.

The bytes written differ from ``json.dumps``'s (non-ASCII characters as UTF-8 rather than ``\\u`` escapes, no
spaces), the JSON they hold does not: the engine and the harness parse the same values.

    value, fast = loads(data)                  # json.loads(data)'s value; fast: orjson read it
    data = dumps(value, fast)                  # compact JSON bytes of it
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["loads", "dumps"]

# Every byte to b" " but the ten digits to b"0": a run of 19 digits in the text is then a run of 19 b"0"s,
# found by a C substring search (a regex for it took 0.8 ms on the request, more than json.loads itself).
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19


def loads(data: bytes) -> tuple[Any, bool]:
    """(``json.loads(data)``, whether orjson read it). Raises what ``json.loads`` raises for text it refuses."""
    if _LONG_RUN not in data.translate(_DIGITS):
        try:
            return orjson.loads(data), True
        except orjson.JSONDecodeError:
            pass  # json's reading (and its error) decides, as before
    return json.loads(data), False


def dumps(value: Any, fast: bool) -> bytes:
    """Compact JSON of `value`: orjson's when `fast` (see the module doc) and orjson can write it, json's else."""
    if fast:
        try:
            return orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a lone surrogate, a key not a str
            pass
    return json.dumps(value, separators=(",", ":")).encode()
