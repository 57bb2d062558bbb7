"""A small synchronous Kubernetes REST client for scripts: `make demo` (lab.demo), bench/ and e2e/ (not in the wheel).

The extender itself is asynchronous (kubernetes_asyncio); scripts that create a workload, wait and report are
simpler with plain blocking calls. This reads a kubeconfig (current context; certificate files or inline
``*-data``; bearer token), speaks JSON over urllib3, and offers the few calls the scripts need. Bursts use a
thread pool (urllib3's pool is thread-safe).
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import urllib3
import yaml

__all__ = ["Kube", "KubeError", "http_json", "scrape_metrics"]


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _materialise(entry: Mapping[str, Any], key: str, base: Path, tmp: list[str]) -> str | None:
    """A file path for ``key`` (``certificate-authority`` ...), writing ``key-data`` to a temp file."""
    if entry.get(key):
        p = Path(str(entry[key]))
        return str(p if p.is_absolute() else base / p)
    data = entry.get(f"{key}-data")
    if not data:
        return None
    fd, path = tempfile.mkstemp(prefix="qos-kube-", suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    tmp.append(path)
    return path


class Kube:
    def __init__(self, kubeconfig: str, *, timeout: float = 30.0, maxsize: int = 32) -> None:
        path = Path(kubeconfig.split(os.pathsep)[0])
        cfg = yaml.safe_load(path.read_text()) or {}
        ctx_name = cfg.get("current-context")
        ctx = next((c["context"] for c in cfg.get("contexts", []) if c["name"] == ctx_name), None)
        if ctx is None:
            raise ValueError(f"{path}: no current-context")
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user: dict[str, Any] = next((u["user"] for u in cfg.get("users", []) if u["name"] == ctx.get("user")), {}) or {}
        self._tmp: list[str] = []
        base = path.parent
        self.server = str(cluster["server"]).rstrip("/")
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self.http = urllib3.PoolManager(
            maxsize=maxsize,
            block=True,
            ca_certs=_materialise(cluster, "certificate-authority", base, self._tmp),
            cert_reqs="CERT_NONE" if cluster.get("insecure-skip-tls-verify") else "CERT_REQUIRED",
            cert_file=_materialise(user, "client-certificate", base, self._tmp),
            key_file=_materialise(user, "client-key", base, self._tmp),
            timeout=urllib3.Timeout(total=timeout),
            retries=False,
        )

    def close(self) -> None:
        self.http.clear()
        for p in self._tmp:
            Path(p).unlink(missing_ok=True)

    # ------------------------------------------------------------------------------------------ raw calls
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        *,
        ok: Iterable[int] = (200, 201, 202),
        content_type: str | None = None,
    ) -> Any:
        url = self.server + path + (f"?{urlencode(params)}" if params else "")
        headers = dict(self.headers)
        if content_type:
            headers["Content-Type"] = content_type
        data = orjson.dumps(body) if body is not None else None
        resp = self.http.request(method, url, body=data, headers=headers)
        if resp.status not in set(ok):
            raise KubeError(resp.status, resp.data.decode(errors="replace")[:500])
        return orjson.loads(resp.data) if resp.data else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    # ------------------------------------------------------------------------------------------ helpers
    def ensure_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        body = {"metadata": {"name": name, "labels": dict(labels or {})}}
        self.request("POST", "/api/v1/namespaces", body, ok=(201, 409))
        # Pods need the namespace's default ServiceAccount (kube-controller-manager creates it).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
                return
            except KubeError:
                time.sleep(0.1)
        raise TimeoutError(f"namespace {name}: no default ServiceAccount after 30 s")

    def delete_namespace(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{name}", ok=(200, 202, 404))

    def create(self, path: str, obj: Mapping[str, Any]) -> Any:
        return self.request("POST", path, obj, ok=(201,))

    def create_node(self, node: Mapping[str, Any]) -> Any:
        return self.request("POST", "/api/v1/nodes", node, ok=(201, 409))

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 202, 404))

    def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> Any:
        return self.create(f"/api/v1/namespaces/{namespace}/pods", pod)

    def create_pods(self, namespace: str, pods: Sequence[Mapping[str, Any]], parallel: int = 16) -> list[Any]:
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            return list(pool.map(lambda p: self.create_pod(namespace, p), pods))

    def delete_pod(self, namespace: str, name: str, grace: int = 0) -> None:
        self.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": grace}, ok=(200, 202, 404)
        )

    def pods(self, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        params = {"labelSelector": label_selector} if label_selector else {}
        items: list[dict[str, Any]] = self.get(path, **params)["items"]
        return items

    def nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else {}
        items: list[dict[str, Any]] = self.get("/api/v1/nodes", **params)["items"]
        return items

    def log(self, namespace: str, pod: str, *, timestamps: bool = False) -> str:
        """A pod's container log as text (the log endpoint answers text/plain, not JSON)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log" + ("?timestamps=true" if timestamps else "")
        resp = self.http.request("GET", self.server + path, headers={**self.headers, "Accept": "*/*"})
        if resp.status != 200:
            raise KubeError(resp.status, resp.data.decode(errors="replace")[:500])
        return str(resp.data.decode(errors="replace"))

    def events(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return items

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 60.0, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)


def http_json(url: str, **kw: Any) -> Any:
    """GET a JSON document (Prometheus' HTTP API) with urllib3."""
    resp = urllib3.request("GET", url, timeout=10.0, **kw)
    if resp.status != 200:
        raise KubeError(resp.status, resp.data.decode(errors="replace")[:500])
    return orjson.loads(resp.data)


def scrape_metrics(url: str, ca: str, cert: str, key: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The extender's /metrics over mTLS, as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    http = urllib3.PoolManager(ca_certs=ca, cert_file=cert, key_file=key, cert_reqs="CERT_REQUIRED")
    resp = http.request("GET", url, timeout=10.0)
    if resp.status != 200:
        raise KubeError(resp.status, resp.data.decode(errors="replace")[:200])
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(resp.data.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out
