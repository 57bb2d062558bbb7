#!/usr/bin/env python3
"""Minimal scheduler-extender stub for hack/smoke-test.sh (standard library only; NOT the real extender).

Serves POST /filter /prioritize /preempt /bind and GET /metrics /healthz over mutual TLS with the
certificates hack/local-up.sh generates, so the scheduler -> extender and Prometheus -> extender wiring
(URL, CA, SANs, client certificates) can be checked without the real package. Filter passes every node,
prioritize scores 0, preempt keeps the scheduler's victims, bind POSTs the Binding itself.

Environment: EXTENDER_URL, EXTENDER_CA, EXTENDER_SERVING_CERT, EXTENDER_SERVING_KEY, QOS_STATE (for the
admin client certificate used to bind) and KUBE_API (default https://127.0.0.1:6443).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALLS: Counter[str] = Counter()
LOCK = threading.Lock()


def api_context() -> ssl.SSLContext:
    state = os.environ.get("QOS_STATE", "/tmp/qos-local")
    ctx = ssl.create_default_context(cafile=f"{state}/certs/ca.crt")
    ctx.load_cert_chain(f"{state}/certs/admin.crt", f"{state}/certs/admin.key")
    return ctx


API_CTX = api_context()
KUBE_API = os.environ.get("KUBE_API", "https://127.0.0.1:6443")


def bind(args: dict) -> dict:
    ns, name, uid, node = args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"]
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    req = urllib.request.Request(
        f"{KUBE_API}/api/v1/namespaces/{ns}/pods/{name}/binding",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, context=API_CTX, timeout=4):
            return {"Error": ""}
    except Exception as exc:  # noqa: BLE001 - report any failure to the scheduler
        return {"Error": f"bind {ns}/{name} -> {node}: {exc}"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, code: int, payload: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/metrics":
            with LOCK:
                lines = [f'stub_extender_calls_total{{verb="{v}"}} {n}' for v, n in sorted(CALLS.items())]
            self._send(
                200,
                ("\n".join(["# TYPE stub_extender_calls_total counter", *lines]) + "\n").encode(),
                "text/plain; version=0.0.4",
            )
        elif self.path in ("/healthz", "/readyz"):
            self._send(200, b"ok", "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:  # noqa: N802
        verb = self.path.rstrip("/").rsplit("/", 1)[-1]
        args = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        with LOCK:
            CALLS[verb] += 1
        if verb == "filter":
            result: object = {
                "Nodes": None,
                "NodeNames": args.get("NodeNames"),
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
        elif verb == "prioritize":
            result = [{"Host": n, "Score": 0} for n in (args.get("NodeNames") or [])]
        elif verb == "preempt":
            result = {"NodeNameToMetaVictims": args.get("NodeNameToMetaVictims") or {}}
        elif verb == "bind":
            result = bind(args)
        else:
            self._send(404, b"{}")
            return
        pod = args.get("Pod") or {}
        name = (pod.get("metadata") or {}).get("name") or args.get("PodName")
        print(f"stub-extender: {verb} {name}", file=sys.stderr, flush=True)
        self._send(200, json.dumps(result).encode())

    def log_message(self, fmt: str, *a: object) -> None:  # quiet access log
        pass


def main() -> None:
    url = urllib.parse.urlparse(os.environ.get("EXTENDER_URL", "https://127.0.0.1:8443"))
    server = ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port or 8443), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["EXTENDER_SERVING_CERT"], os.environ["EXTENDER_SERVING_KEY"])
    ctx.load_verify_locations(os.environ["EXTENDER_CA"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(f"stub-extender: listening on {url.hostname}:{url.port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
