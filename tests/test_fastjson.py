"""The proxy's JSON (`workbench.capture.fastjson`): orjson where it reads and writes the values the json module
would, json wherever the two differ: every value read equals ``json.loads``'s, every value written reads back equal."""

from __future__ import annotations

import json
import math
import random

import pytest

from workbench.capture.fastjson import dumps, loads

CASES = [
    b'{"model":"m","messages":[{"role":"user","content":"caf\\u00e9 \xe2\x9c\x93"}],"max_tokens":16}',
    b'{"ids":[151644, 8948, 198], "lp":[-0.0, -1.5e-7, -12.25]}',
    b'{"big": 123456789012345678901234567890}',  # beyond 64 bits: json keeps the exact int
    b'{"n": 1234567890123456789}',  # 19 digits
    b'{"x": NaN, "y": Infinity, "z": -Infinity}',  # json reads these, orjson refuses them
    b'{"s": "\\ud800"}',  # a lone surrogate escape
    b'{"f": 1e400}',  # beyond the float range: json gives inf
    b'[1, 2.5, true, null, "a"]',
]


@pytest.mark.parametrize("data", CASES)
def test_loads_reads_what_json_reads_and_dumps_writes_it_back(data):
    value, fast = loads(data)
    want = json.loads(data)
    assert json.dumps(value, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert json.dumps(json.loads(dumps(value, fast)), sort_keys=True) == json.dumps(want, sort_keys=True)


def test_floats_round_trip_to_the_bit():
    rng = random.Random(0)
    values = [rng.uniform(-30, 0) for _ in range(2000)] + [
        rng.random() * 10 ** rng.randint(-300, 300) for _ in range(2000)
    ]
    data = json.dumps({"lp": values}).encode()
    value, fast = loads(data)  # fast or not (a repr such as 0.00012345678901234567 is a run of 20 digits: json)
    assert value["lp"] == values
    assert json.loads(dumps(value, fast))["lp"] == values


def test_logprobs_take_the_fast_path():
    rng = random.Random(1)
    values = [rng.uniform(-30, 0) for _ in range(2000)]  # what a chunk carries
    value, fast = loads(json.dumps({"lp": values}).encode())
    assert fast and value["lp"] == values


def test_refused_text_raises_jsons_error():
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"a": ')
    assert math.isnan(loads(b"NaN")[0]) and loads(b"NaN")[1] is False
