"""A fake Kubernetes API server on 127.0.0.1: ``coordination.k8s.io/v1`` Leases, and read-only
``InferencePool`` objects and pods (for a picker started as the reference chart starts it).

Just enough of the real one for leader election through the real ``kubernetes`` client: read
(404 with a ``Status`` body when absent), create (409 when it exists) and replace, with
optimistic concurrency on ``metadata.resourceVersion`` (409 when stale), as the API server
does. Tests can refuse one candidate's writes (``refuse_holder``: that candidate can no longer
renew, as when its node is cut off) or take the whole API down (``down``: connections refused
at the HTTP level with a 503). Pools (``pools``: (namespace, name) -> the object) are read
whole; pods (``pods``: raw ``V1Pod`` JSON) are listed by namespace and ``labelSelector``
(``k=v,...``), and a watch of them is an empty stream that ends after ``watch_s`` seconds.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PATH = re.compile(r"\A/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/?]+))?")
_POOL = re.compile(
    r"\A/apis/inference\.networking\.k8s\.io/v1/namespaces/([^/]+)/inferencepools/([^/?]+)"
)
_PODS = re.compile(r"\A/api/v1/namespaces/([^/]+)/pods\Z")


def _status(code: int, reason: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
            "code": code, "message": reason}  # fmt: skip


class LeaseAPI:
    """``with LeaseAPI() as api:`` serves at ``api.url`` until the block ends."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.down = False
        self.refuse_holder: str | None = None
        self.writes: list[str | None] = []  # holderIdentity of each accepted write, in order
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.watch_s = 0.5
        self._mutex = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LeaseAPI:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def holder(self, namespace: str = "default", name: str = "prefixroute-epp") -> str | None:
        lease = self.leases.get((namespace, name))
        return None if lease is None else lease.get("spec", {}).get("holderIdentity")

    def client(self) -> Any:
        """A ``CoordinationV1Api`` of the real client, talking to this server."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return client.CoordinationV1Api(client.ApiClient(config))

    def kubeconfig(self) -> str:
        """A kubeconfig (YAML is JSON's superset) naming this server, for a process."""
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        })  # fmt: skip

    # --- the server ------------------------------------------------------------------------
    def _answer(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        if self.down:
            return 503, _status(503, "ServiceUnavailable")
        read = self._read(method, path)
        if read is not None:
            return read
        m = _PATH.match(path)
        if m is None:
            return 404, _status(404, "NotFound")
        namespace, name = m.group(1), m.group(2)
        with self._mutex:
            if method == "GET" and name:
                lease = self.leases.get((namespace, name))
                return (200, lease) if lease is not None else (404, _status(404, "NotFound"))
            assert body is not None
            name = name or body["metadata"]["name"]
            holder = (body.get("spec") or {}).get("holderIdentity")
            if holder is not None and holder == self.refuse_holder:
                return 409, _status(409, "Conflict")
            current = self.leases.get((namespace, name))
            if method == "POST" and current is not None:
                return 409, _status(409, "AlreadyExists")
            if method == "PUT":
                if current is None:
                    return 404, _status(404, "NotFound")
                stale = body["metadata"].get("resourceVersion")
                if stale != current["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict")
            self.version += 1
            body["apiVersion"], body["kind"] = "coordination.k8s.io/v1", "Lease"
            body["metadata"].update(name=name, namespace=namespace,
                                    resourceVersion=str(self.version))  # fmt: skip
            self.leases[(namespace, name)] = body
            self.writes.append(holder)
            return (201 if method == "POST" else 200), body

    def _read(self, method: str, target: str) -> tuple[int, Any] | None:
        """A pool or the pods, or None: not theirs."""
        url = urlsplit(target)
        if method == "GET" and (m := _POOL.match(url.path)):
            pool = self.pools.get((m.group(1), m.group(2)))
            return (200, pool) if pool is not None else (404, _status(404, "NotFound"))
        if method == "GET" and (m := _PODS.match(url.path)):
            query = parse_qs(url.query)
            if query.get("watch") == ["true"]:
                time.sleep(self.watch_s)
                return 200, None  # a watch with no events, ended
            wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",")
                          if kv)  # fmt: skip
            items = [p for p in self.pods if p["metadata"].get("namespace") == m.group(1)
                     and wanted.items() <= p["metadata"].get("labels", {}).items()]  # fmt: skip
            return 200, {"kind": "PodList", "apiVersion": "v1",
                         "metadata": {"resourceVersion": "1"}, "items": items}  # fmt: skip
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                code, answer = api._answer(method, self.path, body)
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                self._reply("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._reply("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._reply("PUT")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
