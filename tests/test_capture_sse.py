"""The SSE decoder (`workbench.capture.sse`): events are the same however the network cuts the bytes."""

from __future__ import annotations

import json
import random

import pytest

from workbench.capture.sse import Event, SSEDecoder


def _decode(*reads: bytes) -> list[Event]:
    decoder = SSEDecoder()
    return [event for read in reads for event in decoder.feed(read)]


def _data(*reads: bytes) -> list[bytes]:
    return [e.data for e in _decode(*reads)]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_each_line_end(end):
    stream = b"data: one" + end + end + b"data: two" + end + end
    assert _data(stream) == [b"one", b"two"]


def test_crlf_split_across_two_reads_does_not_end_the_event_early():
    # "\r" ends a read, "\n" starts the next: one line end, not an empty line. Read as two, the
    # second data line would become an event of its own (and the first would lose it).
    assert _data(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [b"a\nb"]
    assert _data(b'data: {"x": 1}\r', b"\n", b"\r", b"\n") == [b'{"x": 1}']


def test_a_cr_alone_before_the_next_read_is_still_a_line_end():
    # "\r" at the end of a read followed by something other than "\n": the line ended there.
    assert _data(b"data: a\r", b"\r") == [b"a"]
    assert _data(b"data: a\r", b"data: b\r\r") == [b"a\nb"]


def test_every_split_of_a_stream_gives_the_same_events():
    chunks = [{"id": i, "choices": [{"delta": {"content": "é\n" * i}}]} for i in range(5)]
    ends = [b"\n", b"\r\n", b"\r"]
    rng = random.Random(0)
    stream = b""
    for c in chunks:
        end = rng.choice(ends)
        stream += b": keep-alive" + end + b"data: " + json.dumps(c).encode() + end + end
    stream += b"data: [DONE]\r\n\r\n"
    want = [json.dumps(c).encode() for c in chunks] + [b"[DONE]"]
    assert _data(stream) == want
    for cut in range(len(stream) + 1):
        assert _data(stream[:cut], stream[cut:]) == want, cut
    assert _data(*(stream[i : i + 1] for i in range(len(stream)))) == want  # a byte per read
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(stream)), 6))
        reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        assert _data(*reads) == want


def test_comments_are_counted_not_dispatched():
    decoder = SSEDecoder()
    assert decoder.feed(b": ping\n\n:\n\n") == []
    assert decoder.comments == 2
    assert decoder.feed(b": a comment inside\ndata: x\n\n") == [Event(b"x")]


def test_multi_line_data_joins_with_newlines():
    assert _data(b"data: first\ndata:second\ndata:  third\ndata\ndata:\n\n") == [b"first\nsecond\n third\n\n"]


def test_an_event_without_data_dispatches_nothing():
    assert _decode(b"event: ping\n\n", b"id: 7\n\n", b"retry: 100\n\n") == []
    assert _decode(b"data\n\n") == [Event(b"")]  # a data line with no value is data ("")


def test_event_type_and_id():
    events = _decode(b"event: delta\nid: 3\ndata: a\n\ndata: b\n\nid: bad\0id\ndata: c\n\n")
    assert events == [Event(b"a", "delta", "3"), Event(b"b", "message", "3"), Event(b"c", "message", "3")]


def test_unknown_fields_and_a_leading_bom_are_ignored():
    assert _data(b"\xef\xbb", b"\xbfdata: a\nfoo: bar\n\n") == [b"a"]
    assert _data(b"data: a\n\n\xef\xbb\xbfdata: b\n\n") == [b"a"]  # only at the very start


def test_a_cut_stream_leaves_its_last_event_pending():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: half") == [Event(b"a")]
    assert decoder.pending
    assert decoder.feed(b"") == [] and decoder.pending
    done = SSEDecoder()
    done.feed(b"data: a\n\n")
    assert not done.pending
