"""The deployed autoscaler's two replicas (config/kind, on kind workers): the Lease holder's traffic to the API
server is dropped inside its pod's network namespace (iptables DROP: every packet lost, sockets open, the stalled
connection of issue 29), later the next holder's is reset (REJECT tcp-reset: connections refused). The pods are
not touched otherwise (probes still answer, no restart). Each replica's log lines compared: the terms ("leading"
until "stopped acting") and the scans of the two pods never overlap, and the leadership moved both times.

The same with two processes behind pausable proxies: tests/test_leader_live.py (phase 1).
Runs in phase 3 of hack/run-live-tests.sh (markers ``live`` and ``deployed``), on the product fixture; it runs on
the real-node topology as well (the container's PID and namespaces are the node's there).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from datetime import datetime
from typing import Any

import pytest

from e2e.test_deployed import NS, Product, _run, product  # noqa: F401  (the module-scoped product fixture)

pytestmark = [pytest.mark.live, pytest.mark.deployed]

LEASE = "qos-autoscaler"
APP = "app.kubernetes.io/name=qos-autoscaler"


def _holder(p: Product) -> str:
    out = _run([str(p.bin_dir / "kubectl"), "get", "lease", "-n", NS, LEASE, "-o", "json"], p.env, 30)
    return str(json.loads(out)["spec"].get("holderIdentity") or "")


def _pods(p: Product) -> dict[str, dict[str, Any]]:
    out = _run([str(p.bin_dir / "kubectl"), "get", "pods", "-n", NS, "-l", APP, "-o", "json"], p.env, 30)
    return {pod["metadata"]["name"]: pod for pod in json.loads(out)["items"]}


def _until(check: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(1.0)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)


def _pid(p: Product, pod: dict[str, Any]) -> int:
    """The PID of the pod's autoscaler container in its node's PID namespace (the host's, for real nodes)."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    for line in p.ctr(pod["spec"]["nodeName"], "tasks", "ls").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    pytest.fail(f"no task {cid} on {pod['spec']['nodeName']}", pytrace=False)
    raise AssertionError  # unreachable


def _api_addresses(p: Product) -> list[tuple[str, int]]:
    """Where a pod reaches the API server: the kubernetes Service's ClusterIP (before kube-proxy's DNAT, which
    happens outside the pod) and its endpoints."""
    kubectl = str(p.bin_dir / "kubectl")
    svc = json.loads(_run([kubectl, "get", "svc", "-n", "default", "kubernetes", "-o", "json"], p.env, 30))
    out = [(svc["spec"]["clusterIP"], int(svc["spec"]["ports"][0]["port"]))]
    eps = json.loads(_run([kubectl, "get", "endpoints", "-n", "default", "kubernetes", "-o", "json"], p.env, 30))
    for subset in eps.get("subsets", []):
        for addr in subset.get("addresses", []):
            for port in subset.get("ports", []):
                out.append((addr["ip"], int(port["port"])))
    return out


class Cut:
    """iptables rules in one pod's network namespace (entered from its node by the container's PID)."""

    def __init__(self, on_node: list[str], pid: int, addresses: list[tuple[str, int]], target: list[str]) -> None:
        self.on_node, self.pid, self.rules = (
            on_node,
            pid,
            [["-p", "tcp", "-d", ip, "--dport", str(port), "-j", *target] for ip, port in addresses],
        )

    def _iptables(self, op: str, rule: list[str]) -> subprocess.CompletedProcess[str]:
        cmd = [*self.on_node, "nsenter", f"--net=/proc/{self.pid}/ns/net", "iptables", op, "OUTPUT", *rule]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)

    def __enter__(self) -> Cut:
        for rule in self.rules:
            done = self._iptables("-I", rule)
            assert done.returncode == 0, done.stderr
        return self

    def __exit__(self, *_: object) -> None:
        for rule in self.rules:
            self._iptables("-D", rule)


def _log(p: Product, pod: str) -> list[dict[str, Any]]:
    out = _run([str(p.bin_dir / "kubectl"), "logs", "-n", NS, pod, "-c", "autoscaler"], p.env, 60)
    lines = []
    for text in out.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(text))
    return lines


def _terms(lines: list[dict[str, Any]], now: float) -> list[tuple[float, float]]:
    """(began, ended) of each term from the log: "leading" to "stopped acting" (still leading: now)."""
    out: list[tuple[float, float]] = []
    began: float | None = None
    for r in lines:
        at = datetime.fromisoformat(r["time"]).timestamp()
        if r.get("msg") == "leading":
            began = at
        elif r.get("msg") == "stopped acting" and began is not None:
            out.append((began, at))
            began = None
    if began is not None:
        out.append((began, now))
    return out


def test_leader_deployed_partition_never_two_acting(product: Product) -> None:  # noqa: F811 (the fixture)
    p = product
    _until(lambda: len([q for q in _pods(p).values() if _ready(q)]) == 2, "both autoscaler replicas Ready", 300)
    first = _until(lambda: _holder(p) in _pods(p) and _holder(p), "a replica to hold the Lease", 120)
    addresses = _api_addresses(p)
    restarts_before = {n: q["status"]["containerStatuses"][0]["restartCount"] for n, q in _pods(p).items()}
    started = time.time()

    # 1. the leader's packets to the API server are dropped (stalled); the other replica takes over
    pods = _pods(p)
    with Cut(p.on_node(pods[first]["spec"]["nodeName"]), _pid(p, pods[first]), addresses, ["DROP"]):
        second = _until(lambda: (h := _holder(p)) != first and h, "the standby to take the Lease", 90)
        time.sleep(5)  # still cut off: the former leader must stay stopped
    time.sleep(10)
    assert second in pods
    assert _holder(p) == second, "the former leader took the Lease back from a healthy holder"

    # 2. the new leader's connections are reset and refused; the first takes it back
    with Cut(
        p.on_node(_pods(p)[second]["spec"]["nodeName"]),
        _pid(p, _pods(p)[second]),
        addresses,
        ["REJECT", "--reject-with", "tcp-reset"],
    ):
        _until(lambda: _holder(p) == first, "the first replica to take the Lease back", 90)
        time.sleep(5)
    time.sleep(10)

    now = time.time()
    logs = {name: _log(p, name) for name in (first, second)}
    restarts = {n: q["status"]["containerStatuses"][0]["restartCount"] for n, q in _pods(p).items()}
    terms = {n: [t for t in _terms(lines, now) if t[1] >= started - 60] for n, lines in logs.items()}
    scans = {
        n: [float(r["decision"]["at"]) for r in lines if r.get("msg") == "scan" and r["decision"]["at"] >= started - 60]
        for n, lines in logs.items()
    }
    print(f"terms: {terms}; scans: { {n: len(s) for n, s in scans.items()} }; restarts: {restarts}")
    assert all(terms.values()), terms  # both led in the window
    for a0, a1 in terms[first]:
        for b0, b1 in terms[second]:
            assert a1 + 1.0 <= b0 or b1 + 1.0 <= a0, ("terms overlap", (a0, a1), (b0, b1))
    for t in scans[first]:
        assert all(abs(t - u) >= 1.0 for u in scans[second]), ("two replicas scanned within a second", t)
    for n, ts in scans.items():  # every action inside a term of its own replica
        outside = [t for t in ts if not any(b0 - 0.5 <= t <= b1 + 0.5 for b0, b1 in terms[n])]
        assert outside == [], (n, outside, terms[n])
    assert restarts == restarts_before, "a replica was restarted: the test must cut traffic, not kill"


def _ready(obj: dict[str, Any]) -> bool:
    conds = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
