"""A relay between a harness and the capture proxy that notes what the harness sends on the wire (a test double).

The proxy calls the engine unstreamed whatever the harness asked, and keeps no header; tests that check a
harness's stream mode and credential put this in front of it:

    wire = Wire(proxy_port)           # then give the harness wire.url instead of the proxy's
    wire.seen                         # [(method, path, credential header names, body's "stream"), ...]
    wire.stop()
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Wire:
    """A relay in front of the proxy that notes what the harness sends on the wire (the proxy calls the engine
    unstreamed whatever the harness asked, and keeps no header): method, path, credential headers, ``stream``."""

    def __init__(self, port: int) -> None:
        self.seen: list[tuple[str, str, list[str], object]] = []
        wire = self

        class Relay(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.startswith(("/sessions", "/engine", "/model")):  # not the trainer's own calls
                    creds = sorted(k.lower() for k in self.headers if k.lower() in ("authorization", "x-api-key"))
                    stream = json.loads(body).get("stream") if body.startswith(b"{") else None
                    wire.seen.append((self.command, self.path, creds, stream))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Relay)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
