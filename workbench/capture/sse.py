"""A server-sent events decoder: bytes in, events out, one network read at a time. Pure (no I/O).

The capture proxy reads the engine's streamed reply as it arrives (`workbench.capture.stream`); a read
ends wherever the network cut it, in the middle of a line or between the ``\\r`` and ``\\n`` of one
line end. This decoder keeps what is incomplete and follows the WHATWG parsing rules
(html.spec.whatwg.org, "server-sent events", event stream interpretation):

- a line ends in ``\\r\\n``, ``\\n`` or ``\\r`` alone; a ``\\r`` that ends one read and a ``\\n`` that
  starts the next are one line end (not an empty line, which would end the event early);
- a blank line dispatches the event; one without any ``data`` line dispatches nothing;
- ``data`` lines join with ``\\n``; one space after the colon is dropped; a line without a colon is a
  field with an empty value; ``:`` starts a comment (OpenEnv's and vLLM's keep-alives), counted only;
- ``event`` and ``id`` are kept (an ``id`` holding NUL is ignored), ``retry`` and unknown fields are
  ignored; a byte-order mark at the very start is dropped; an event cut off by the end of the stream
  is never dispatched (`pending` says whether something was left).

``data`` stays bytes: the relay hands it to ``json.loads`` as it is (vLLM sends one JSON chunk per
event, ~100-300 bytes, several per read on a busy engine).

    decoder = SSEDecoder()
    for read in (b'data: {"a"', b': 1}\\r', b'\\n\\r\\n: ping\\n\\n'):
        for event in decoder.feed(read):
            event.data                       # b'{"a": 1}', once
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Event", "SSEDecoder"]

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Event:
    """One dispatched event: its data lines joined by ``\\n``, its type (``message`` unless an ``event``
    line named one) and the last event id seen on the stream (None before any)."""

    data: bytes
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """Incremental event-stream parser (see the module doc). One per stream; not thread-safe."""

    def __init__(self) -> None:
        self._tail = b""  # an incomplete last line
        self._skip_lf = False  # the last read ended in "\r": a "\n" opening the next belongs to it
        self._started = False  # past the first bytes (where a BOM may be)
        self._data: list[bytes] = []
        self._event = ""
        self._last_id: str | None = None
        self.comments = 0

    @property
    def pending(self) -> bool:
        """Whether bytes of an event not yet dispatched are held (at the end of a stream: a cut event)."""
        return bool(self._tail or self._data or self._event)

    def feed(self, data: bytes) -> list[Event]:
        """The events that `data` completes, in order."""
        if self._skip_lf and data[:1] == b"\n":
            data = data[1:]
        if not data:
            return []
        self._skip_lf = data[-1:] == b"\r"
        if not self._started:
            buffer = self._tail + data
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._tail = buffer  # could still be the start of a BOM
                return []
            self._started = True
            buffer = buffer.removeprefix(_BOM)
        else:
            buffer = self._tail + data if self._tail else data
        # bytes.splitlines breaks at "\r\n", "\n" and "\r" only (unlike str's, which knows ten more)
        lines = buffer.splitlines(keepends=True)
        self._tail = lines.pop() if lines and lines[-1][-1:] not in (b"\n", b"\r") else b""
        events: list[Event] = []
        for line in lines:
            line = line.rstrip(b"\r\n")  # one line end at most: splitlines cut there
            if not line:
                if self._data:
                    events.append(Event(b"\n".join(self._data), self._event or "message", self._last_id))
                self._data, self._event = [], ""
            elif line[:1] == b":":
                self.comments += 1
            else:
                self._field(line)
        return events

    def _field(self, line: bytes) -> None:
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\0" not in value:
            self._last_id = value.decode("utf-8", "replace")
