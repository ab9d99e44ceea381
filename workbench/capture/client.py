"""The trainer's side of a capture proxy: its control plane over HTTP (httpx only).

Minting rollout keys, reading traces, pointing the proxy at a new policy, checking the engine behind
it. Importable without OpenEnv's capture server (which brings ~3,400 modules, gradio and pandas among
them): the trainer, the rollout runner and the notebooks only need to speak HTTP to a proxy, in this
process (`CaptureProxy.client()`) or on another host.

    client = ProxyClient("http://127.0.0.1:8100", admin_key)
    key = client.open_session(harness="opencode", temperature=1.0)   # the agent's bearer token
    calls = client.trace(key)                                       # every call, exact ids
    client.close_session(key)
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["ProxyClient", "ProxyError", "REPLICA_DRAINED"]

# The finding a session gets when its engine, one of several behind the proxy, stopped answering and its calls were
# moved to another (`workbench.capture.watch`): a rollout with a failed call and this finding ended because of it.
REPLICA_DRAINED = "replica_drained"


class ProxyError(RuntimeError):
    """The proxy refused a control request or could not be reached."""


class ProxyClient:
    """The trainer-side control plane of a capture proxy (in-process or remote), over HTTP."""

    def __init__(self, url: str, admin_key: str) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60)
        self._model: str | None = None

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ProxyError(f"capture proxy not reachable at {self.url}: {exc}") from exc
        if r.status_code != 200:
            raise ProxyError(f"{method} {path} answered {r.status_code}: {r.text[:300]}")
        return r.json()

    @property
    def model(self) -> str:
        """The served model name the proxy sends upstream (the harness may call it anything)."""
        if self._model is None:
            self._model = self._call("GET", "/engine")["model"]
        return self._model

    def set_model(self, name: str) -> None:
        """Point every later call at `name` (the policy version the next rollouts sample from)."""
        self._model = self._call("PUT", "/model", json={"model": name})["model"]

    def check_engine(self) -> None:
        """Raise ProxyError("engine not reachable at URL") unless the engine answers through the proxy."""
        info = self._call("GET", "/engine")
        self._model = info["model"]
        if not info["reachable"]:
            raise ProxyError(f"engine not reachable at {info['url']}: {info['error']}")

    @property
    def agent_base_url(self) -> str:
        """What the sandboxed agent is given: the proxy, never the engine."""
        return f"{self.url}/v1"

    def open_session(
        self,
        *,
        harness: str,
        temperature: float | None,
        max_model_calls: int = 0,
        max_output_tokens: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Mint a rollout key. With `temperature`, the full sampling policy is pinned for every call."""
        meta = {"harness": harness, **(metadata or {})}
        if max_output_tokens:
            meta["max_output_tokens"] = max_output_tokens
        payload: dict[str, Any] = {"metadata": meta, "max_model_calls": max_model_calls, "purpose": "train"}
        if temperature is not None:
            payload["sampling"] = {"temperature": temperature}
        return self._call("POST", "/sessions", json=payload)["session_id"]

    def status(self, key: str) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{key}")

    def trace(self, key: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/sessions/{key}/trace")["calls"]

    def findings(self, key: str) -> list[str]:
        """The capture's findings for the session (OpenEnv's: ``[FATAL] capture_ingest_failed: ...`` when a turn
        could not be recorded)."""
        return list(self._call("GET", f"/sessions/{key}/trace").get("findings") or [])

    def close_session(self, key: str) -> None:
        """End the session; the proxy forgets it and its call log (read `trace` first)."""
        self._call("DELETE", f"/sessions/{key}")

    def close(self) -> None:
        self._http.close()
