"""Rollouts fanned out over a Ray cluster: each sandbox node runs its own capture proxy beside its sandboxes.

`run_rollouts` runs every rollout on this machine. With a cluster, the driver (the trainer, `workbench eval`) keeps
the run folder and the engine's address; every node that advertises the ``sandbox`` resource (``ray start
--resources '{"sandbox": 8}'``: that many rollouts at once there) gets one worker, which starts a capture proxy on
its own loopback in front of the same engine, runs each rollout it is given in a sandbox there (the harness's
traffic never leaves the node; only the proxy's, with the engine's key, does), grades it there, and sends back the
whole rollout folder (trace, turns, summary, reward), which the driver unpacks into the run folder before the step
reads it.

    from workbench.rollout import NodeProxy, fan_out
    with fan_out("127.0.0.1:6379", NodeProxy(engine.url, engine.served_name, engine.api_key)) as cluster:
        results = cluster.run(jobs, config, model=client.model)   # jobs as for run_rollouts; same results
        cluster.requeued, cluster.lost                              # what the nodes that died cost

Placement: a group's rollouts are spread over the nodes (each job goes to the node holding the fewest of its
task's rollouts so far, then the least busy): one node lost costs a group a few rollouts, not all of them (Ray's
default packing put 128 sandboxes on one node elsewhere: benchmarks/cluster_sim.py models the difference).

Nothing lost, nothing faked: a node, worker or proxy that dies mid-rollout ends its rollouts as infrastructure
failures, re-queued on a live node up to `retries` times; past that (or with no node left) a rollout ends
``worker_lost``, unscored (`FAILED_STATUSES`), never a reward of 0. The policy version is the driver's proxy's
served name (`model=`), set on a node's proxy before each rollout, so a policy sync reaches every node.
A node's scratch folder is removed when its worker closes; one left by a node that died is removed by the driver
when that folder is on the driver's own disk (a cluster on one machine). A driver that dies takes its workers with it
(Ray kills a dead job's actors, and their sandboxes die with them), but not their scratch folders: each is named
after its worker's pid, and the next worker that starts on that node (the resumed run's) removes every one whose
worker is gone.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.rollout.types import RolloutConfig, RolloutResult
from workbench.runs import atomic_json
from workbench.sandbox import force_remove
from workbench.tasks import Task

__all__ = ["NodeProxy", "Cluster", "fan_out", "rollouts_on", "SANDBOX_RESOURCE"]

SANDBOX_RESOURCE = "sandbox"  # a node's sandbox slots: ray start --resources '{"sandbox": N}'


@dataclass(frozen=True)
class NodeProxy:
    """What each node's capture proxy needs: the engine (reachable from every node) and the driver proxy's caps.

    Attributes:
        upstream: the engine's OpenAI-compatible URL, as the nodes reach it.
        model: the engine's served name (a node's proxy starts on it; `Cluster.run`'s ``model`` moves it).
        upstream_api_key: the engine's key (None: an engine without one).
        max_output_tokens: the proxy's per-call output cap (as the driver's proxy).
        bookkeeping_max_tokens: the output caps by call purpose (None: `workbench.capture.BOOKKEEPING_MAX_TOKENS`).
        replicas: more engines serving the same weights; each node's proxy pins a session to one of them.
    """

    upstream: str
    model: str
    upstream_api_key: str | None = None
    max_output_tokens: int = 4096
    bookkeeping_max_tokens: dict[str, int] | None = None
    replicas: tuple[str, ...] = ()


_SCRATCH = "wb-node-"  # a worker's scratch folder: wb-node-<its pid>-<random>


def _sweep_orphans(tmp: Path) -> list[Path]:
    """Remove the scratch folders under `tmp` whose worker process is gone (a driver killed with SIGKILL: Ray kills
    its workers, which then close nothing). A folder whose pid is alive stays, whoever has that pid now: a live
    worker's is never touched, at the cost of keeping a dead one's until its pid is free again. Returns the removed."""
    removed = []
    for folder in tmp.glob(f"{_SCRATCH}*-*"):
        pid = folder.name[len(_SCRATCH) :].split("-", 1)[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        force_remove(folder)
        removed.append(folder)
    return removed


class _NodeWorker:
    """One node's rollouts (a Ray actor, threaded: `slots` at once): a capture proxy on the node's loopback, a
    scratch folder, and `rollout()` returning a finished rollout's folder as a gzipped tar."""

    def __init__(self, proxy: NodeProxy) -> None:
        from workbench.capture import CaptureProxy

        self.proxy = CaptureProxy(
            proxy.upstream,
            proxy.model,
            upstream_api_key=proxy.upstream_api_key,
            max_output_tokens=proxy.max_output_tokens,
            bookkeeping_max_tokens=proxy.bookkeeping_max_tokens,
            replicas=proxy.replicas,
        ).start()
        self.client = self.proxy.client()
        # Everything this node's rollouts make (rollout folders, sandbox and grading folders) goes below one
        # folder, so closing the worker, or the driver after the node died, removes all of it. 0711: a sandbox's
        # fresh uid must pass through it to its own folder (as through /tmp), not list it.
        _sweep_orphans(Path(tempfile.gettempdir()))
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH}{os.getpid()}-"))
        self.scratch.chmod(0o711)
        os.environ["TMPDIR"] = tempfile.tempdir = str(self.scratch)

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "scratch": str(self.scratch)}

    def rollout(self, task: Task, config: RolloutConfig, name: str, model: str) -> tuple[dict[str, Any], bytes]:
        from workbench.rollout.run import run_rollout

        if self.client.model != model:  # the policy the driver's proxy serves now (a sync moved it)
            self.client.set_model(model)
        out = self.scratch / name
        try:
            result = run_rollout(task, self.client, config, out, rollout_id=name)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
                tar.add(out, arcname=".")
            return result.summary, buf.getvalue()
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        self.proxy.stop()
        force_remove(self.scratch)


@dataclass
class _Node:
    node_id: str
    slots: int
    actor: Any
    scratch: str = ""
    busy: int = 0
    alive: bool = True
    placed: dict[str, int] = field(default_factory=dict)  # task id -> rollouts of it given to this node this run


class Cluster:
    """The driver's side of a fan-out (made by `fan_out`): one worker per sandbox node, `run()` as `run_rollouts`."""

    def __init__(self, nodes: list[_Node], *, retries: int) -> None:
        self.nodes, self.retries = nodes, retries
        self.requeued = 0  # rollouts given to another node after theirs died (over this cluster's life)
        self.lost = 0  # rollouts ended worker_lost (retries spent, or no node left)

    @property
    def slots(self) -> int:
        return sum(n.slots for n in self.nodes if n.alive)

    def run(self, jobs: list[tuple[Task, Path]], config: RolloutConfig, *, model: str) -> list[RolloutResult]:
        """Every job's rollout on some node, its folder unpacked at the job's path on this machine before this
        returns; results in job order. `model`: the served name the rollouts sample (the driver proxy's)."""
        import ray

        results: list[RolloutResult | None] = [None] * len(jobs)
        tries = [0] * len(jobs)
        queue = deque(range(len(jobs)))
        running: dict[Any, tuple[int, _Node]] = {}
        try:
            while queue or running:
                while queue and (node := self._place(jobs[queue[0]][0].id)) is not None:
                    i = queue.popleft()
                    task, out = jobs[i]
                    node.busy += 1
                    node.placed[task.id] = node.placed.get(task.id, 0) + 1
                    running[node.actor.rollout.remote(task, config, out.name, model)] = (i, node)
                if not running:  # jobs left and no live node to take them
                    for i in queue:
                        results[i] = self._lost(jobs[i], tries[i], "no sandbox node is left alive")
                    queue.clear()
                    break
                done, _ = ray.wait(list(running), num_returns=1, timeout=5.0)
                for ref in done:
                    i, node = running.pop(ref)
                    node.busy -= 1
                    try:
                        summary, blob = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # ours raised on the node: as run_rollouts does
                        results[i] = self._crashed(jobs[i], exc)
                        continue
                    except ray.exceptions.RayError as exc:  # the node, its worker or its object went away
                        node.alive = self._alive(node)
                        tries[i] += 1
                        why = f"{type(exc).__name__} on node {node.node_id[:12]}: {str(exc).splitlines()[0][:200]}"
                        if tries[i] <= self.retries:
                            self.requeued += 1
                            queue.appendleft(i)
                        else:
                            results[i] = self._lost(jobs[i], tries[i], why)
                        continue
                    results[i] = self._unpack(jobs[i], summary, blob, tries[i], node.node_id)
        except BaseException:  # Ctrl-C: no rollout left running on any node; their folders say interrupted
            self.close(kill=True)  # a killed worker's sandboxes die with it (bwrap --die-with-parent)
            for i, _ in running.values():
                task, out = jobs[i]
                out.mkdir(parents=True, exist_ok=True)
                atomic_json(
                    out / "summary.json",
                    {"rollout_id": out.name, "task_id": task.id, "status": "interrupted", "reward": None,
                     "reason": "interrupted by the user (on a cluster node)"},
                )  # fmt: skip
            raise
        return [r for r in results if r is not None]

    def _place(self, task_id: str) -> _Node | None:
        free = [n for n in self.nodes if n.alive and n.busy < n.slots]
        return min(free, key=lambda n: (n.placed.get(task_id, 0), n.busy / n.slots)) if free else None

    def _alive(self, node: _Node) -> bool:
        import ray

        try:
            ray.get(node.actor.where.remote(), timeout=30)
            return True
        except (ray.exceptions.RayError, TimeoutError):
            return False

    def _lost(self, job: tuple[Task, Path], tries: int, why: str) -> RolloutResult:
        task, out = job
        self.lost += 1
        reason = f"the node running it was lost {tries} time(s) (re-queued {min(tries, self.retries)}): {why}"
        summary = {"rollout_id": out.name, "task_id": task.id, "status": "worker_lost", "reason": reason}
        out.mkdir(parents=True, exist_ok=True)
        atomic_json(out / "summary.json", {**summary, "reward": None, "node_tries": tries})
        return RolloutResult(out.name, task.id, "worker_lost", reason, None, out, {**summary, "reward": None})

    def _crashed(self, job: tuple[Task, Path], exc: Exception) -> RolloutResult:
        task, out = job
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        summary = {"rollout_id": out.name, "task_id": task.id, "status": "crashed", "reason": reason, "reward": None}
        out.mkdir(parents=True, exist_ok=True)
        atomic_json(out / "summary.json", summary)
        (out / "crash.txt").write_text(str(exc))  # ours, not the agent's: where it broke (the node's traceback)
        return RolloutResult(out.name, task.id, "crashed", reason, None, out, summary)

    def _unpack(
        self, job: tuple[Task, Path], summary: dict[str, Any], blob: bytes, tries: int, node_id: str
    ) -> RolloutResult:
        task, out = job
        if out.exists():  # an earlier attempt's partial folder (its node died while sending): not this rollout's
            shutil.rmtree(out)
        out.mkdir(parents=True)
        out.chmod(0o700)
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            tar.extractall(out, filter="data")  # the workspace is the agent's: no link or path out of `out`
        summary = {**summary, "node": node_id, "node_tries": tries + 1}  # where it ran, and on its how-manyth node
        atomic_json(out / "summary.json", summary)
        return RolloutResult(
            summary.get("rollout_id", out.name),
            task.id,
            summary["status"],
            summary.get("reason"),
            summary.get("reward"),
            out,
            summary,
        )

    def close(self, *, kill: bool = False) -> None:
        """Stop every worker: closed (its proxy stopped, its scratch removed), then killed; `kill`: killed at once
        (rollouts still running). A scratch folder left on this disk (a dead node's, a killed worker's) is removed."""
        import ray

        for n in self.nodes:
            if n.alive and not kill:
                with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                    ray.get(n.actor.close.remote(), timeout=60)
            with contextlib.suppress(Exception):
                ray.kill(n.actor)
            n.alive = False
            if n.scratch and Path(n.scratch).is_dir():  # a dead node's scratch, when it is on this disk
                force_remove(Path(n.scratch))


def rollouts_on(
    cluster: str, engine: Any, max_output_tokens: int, bookkeeping_max_tokens: dict[str, int] | None = None
) -> contextlib.AbstractContextManager[Cluster | None]:
    """`fan_out` to the cluster a config names, its nodes' proxies in front of `engine` (a
    `workbench.engine.Engine`: url, served_name, api_key) with the driver's caps; None for ``local``."""
    if cluster == "local":
        return contextlib.nullcontext(None)
    proxy = NodeProxy(engine.url, engine.served_name, engine.api_key, max_output_tokens, bookkeeping_max_tokens)
    return fan_out(cluster, proxy)


@contextlib.contextmanager
def fan_out(address: str, proxy: NodeProxy, *, retries: int = 2, start_timeout_s: float = 120.0) -> Iterator[Cluster]:
    """Connect to the Ray cluster at `address` (``HOST:PORT`` of a head started with ``ray start --head``), start
    one worker on every live node that advertises ``sandbox`` slots, yield the `Cluster`; on leaving stop every
    worker (proxy, scratch) and disconnect. `retries`: how often a rollout whose node died is given to another."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    connected_here = not ray.is_initialized()
    if connected_here:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    nodes: list[_Node] = []
    cluster = Cluster(nodes, retries=retries)
    try:
        actor = ray.remote(_NodeWorker)
        for info in ray.nodes():
            slots = int(info.get("Resources", {}).get(SANDBOX_RESOURCE, 0))
            if not info.get("Alive") or slots < 1:
                continue
            handle = actor.options(
                num_cpus=0,
                resources={SANDBOX_RESOURCE: slots},
                max_concurrency=slots + 2,  # the rollouts, and where()/close() beside them
                scheduling_strategy=NodeAffinitySchedulingStrategy(info["NodeID"], soft=False),
                max_restarts=0,
            ).remote(proxy)
            nodes.append(_Node(info["NodeID"], slots, handle))
        if not nodes:
            raise RuntimeError(
                f"the Ray cluster at {address} has no live node with a {SANDBOX_RESOURCE!r} resource: start sandbox"
                f" nodes with ray start --address {address} --resources '{{\"{SANDBOX_RESOURCE}\": N}}'"
            )
        deadline = time.monotonic() + start_timeout_s
        for n in nodes:
            n.scratch = ray.get(n.actor.where.remote(), timeout=max(1.0, deadline - time.monotonic()))["scratch"]
        yield cluster
    finally:
        cluster.close()
        if connected_here:
            ray.shutdown()
