"""What the streamed relay does while the engine samples: work that needs only the request and the prompt ids.

Once a call's first chunk (with its prompt ids) is relayed, the engine spends a token's time or more (20 ms and up
here) before the next chunk: the proxy's loop is free. Work done there is off every path; after ``[DONE]`` it is not,
since a harness that sends its next call at once waits behind it (benchmarks/README.md, proxy overhead: the next
request sat behind the last call's ingest and settling, ~0.9 ms of the added latency). So the relay calls
`while_sampling` there, once per call:

    checked = while_sampling(turn.prompt_ids, chat_request["messages"])   # (ids, valid) for `ingest(prompt_valid=)`

It does three things: the raw request's fidelity (`record.request_fidelity`, set on the current call, which
`CallRecorder.finish` then keeps), the prompt ids' check (`ingest.valid_token_ids`), and the young generations'
garbage collection (`collect_while_waiting`).
"""

from __future__ import annotations

import gc
from typing import Any

from workbench.capture.ingest import valid_token_ids
from workbench.capture.record import current_call, request_fidelity

__all__ = ["collect_while_waiting", "while_sampling"]


def while_sampling(
    prompt_ids: list[int] | None, forwarded: list[dict[str, Any]]
) -> tuple[list[int] | None, bool | None]:
    """The call's fidelity against the `forwarded` messages, its young garbage collected; returns the prompt ids
    with `valid_token_ids` of them (None when the engine sent none), for the ingest after ``[DONE]``."""
    call = current_call.get()
    if call is not None:
        call.fidelity = request_fidelity(call, forwarded)
    valid = valid_token_ids(prompt_ids) if prompt_ids is not None else None
    collect_while_waiting()
    return prompt_ids, valid


def collect_while_waiting() -> None:
    """Collect the young generations now, while the call waits for the engine's next token.

    Each call keeps ~100-300 new containers (the request's messages on its turn, the turn itself, its 7,097 prompt
    ids in one list), so CPython's automatic young collections fell wherever an allocation crossed the threshold:
    mostly while the next request was parsed, on that call's path. Every tenth of them is a generation-1
    collection, which walked every turn recorded since the last one (~80 turns, ~600k list items): 14-16 ms
    on the 2-core EPYC of benchmarks/README.md section 1, a call's added p99. Run here once per call, right
    after its first chunk is relayed, the same collections are regular and small (generation 1 then holds
    ~10 turns: at most 1.7 ms, measured) and land where nothing waits on the proxy; the total work is the same
    (each object is still scanned once per generation). Nothing is done when collection is disabled or the young
    generation holds little; a process that tuned its thresholds keeps them (they are read, not set)."""
    if not gc.isenabled():
        return
    count0, count1, _ = gc.get_count()
    threshold0, threshold1, _ = gc.get_threshold()
    if threshold0 <= 0:
        return
    if count1 >= threshold1 - 1:  # the next automatic collection would be of generation 1
        gc.collect(1)
    elif count0 > threshold0 // 8:
        gc.collect(0)
