"""Two real `qos-extender autoscaler` replicas against a real kube-apiserver, each through its own TCP proxy: the
leader's traffic is paused (bytes stop, sockets stay open: the stalled connection of issue 29), later the other
leader's is refused (listener closed, connections reset). Every scan a leader runs is one JSON log line
("scan", with its identity and wall time); the test compares both replicas' lines: never two identities within
overlapping time (the hand-over gaps are at least a second), and each pause or refusal moved the leadership.

The decisions behind it are tested over arbitrary timelines in tests/test_leader.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from extender.kube.client import new_api_client
from extender.settings.sections import KubernetesConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

LEASE_DURATION, RENEW_DEADLINE, RETRY = 5, 3.0, 1.0
QOS_EXTENDER = str(Path(sys.executable).with_name("qos-extender"))


class PausableProxy:
    """A TCP relay to the API server that can stall (stop forwarding bytes, every socket kept open) or refuse
    (stop listening and reset every connection), and come back."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self.flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self.flowing.wait()  # paused: what was read is held, nothing more is read
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.writers -= {writer, up_writer}

    def pause(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    async def refuse(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self.writers):
            w.transport.abort()  # RST: connection reset; new connections: refused (nothing listens)
        await self.server.wait_closed()
        self.server = None

    async def close(self) -> None:
        self.resume()
        if self.server is not None:
            await self.refuse()


class Replica:
    """One `qos-extender autoscaler` process; its stderr JSON lines are collected as they come."""

    def __init__(self, identity: str, workdir: Path, kubeconfig: str, lease: str) -> None:
        self.identity = identity
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        d = workdir / identity
        d.mkdir()
        self.extender = d / "extender.yaml"
        self.extender.write_text(
            yaml.safe_dump({"kubernetes": {"kubeconfig": kubeconfig, "events": False, "request_timeout_seconds": 5}})
        )
        self.autoscaler = d / "autoscaler.yaml"
        self.autoscaler.write_text(
            yaml.safe_dump(
                {
                    "autoscaler": {
                        "scan_interval_seconds": 0.2,
                        "leader_election": {
                            "lease_name": lease,
                            "lease_namespace": "kube-system",
                            "identity": identity,
                            "lease_duration_seconds": LEASE_DURATION,
                            "renew_deadline_seconds": RENEW_DEADLINE,
                            "retry_period_seconds": RETRY,
                        },
                    }
                }
            )
        )
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            QOS_EXTENDER,
            "autoscaler",
            f"--config={self.extender}",
            f"--autoscaler-config={self.autoscaler}",
            "--metrics-port=0",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "KUBECONFIG": ""},
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for line in self.proc.stderr:
            text = line.decode(errors="replace").strip()
            self.raw.append(text)
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(text))

    def scans(self) -> list[float]:
        return [
            float(r["decision"]["at"])
            for r in self.lines
            if r.get("msg") == "scan" and r.get("decision", {}).get("identity") == self.identity
        ]

    async def get(self, path: str) -> tuple[int, str]:
        """GET on the replica's metrics listener (plain HTTP on 127.0.0.1: no metrics.cert_file here)."""
        (port,) = {r["decision"]["metrics_port"] for r in self.lines if r.get("msg") == "autoscaler started"}
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as resp:
            return resp.status, await resp.text()

    async def leader_gauge(self) -> float:
        status, text = await self.get("/metrics")
        assert status == 200, text
        (value,) = [
            float(line.split()[1]) for line in text.splitlines() if line.startswith("qos_extender_autoscaler_leader ")
        ]
        return value

    def said(self, msg: str) -> int:
        return sum(1 for r in self.lines if r.get("msg") == msg)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)


async def _until(check: Callable[[], bool], what: str, timeout: float, replicas: list[Replica]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tails = {r.identity: r.raw[-15:] for r in replicas}
            pytest.fail(f"timed out waiting for {what}; logs: {json.dumps(tails, indent=1)}")
        await asyncio.sleep(0.1)


def _proxied_kubeconfig(source: str, port: int, path: Path) -> tuple[str, int]:
    """A copy of the kubeconfig whose server is the proxy (the serving certificate names 127.0.0.1)."""
    doc = yaml.safe_load(Path(source).read_text())
    cluster = doc["clusters"][0]["cluster"]
    url = urlsplit(cluster["server"])
    upstream = (url.hostname or "127.0.0.1", url.port or 443)
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    for u in doc.get("users", []):  # file references stay valid from another folder
        for key in ("client-certificate", "client-key"):
            if key in u.get("user", {}) and not os.path.isabs(u["user"][key]):
                u["user"][key] = str(Path(source).parent / u["user"][key])
    if "certificate-authority" in cluster and not os.path.isabs(cluster["certificate-authority"]):
        for c in doc["clusters"]:
            c["cluster"]["certificate-authority"] = str(Path(source).parent / cluster["certificate-authority"])
    path.write_text(yaml.safe_dump(doc))
    return str(path), upstream[1]


def _upstream(source: str) -> tuple[str, int]:
    url = urlsplit(yaml.safe_load(Path(source).read_text())["clusters"][0]["cluster"]["server"])
    return url.hostname or "127.0.0.1", url.port or 443


def _overlaps(a: list[float], b: list[float], gap: float) -> list[tuple[float, float]]:
    """Pairs of actions of the two identities closer than ``gap`` seconds (none: they never acted together)."""
    merged = sorted([(t, "a") for t in a] + [(t, "b") for t in b])
    return [(t0, t1) for (t0, w0), (t1, w1) in itertools.pairwise(merged) if w0 != w1 and t1 - t0 < gap]


def test_overlap_check_is_not_vacuous() -> None:
    assert _overlaps([1.0, 2.0], [2.5, 3.0], 1.0) == [(2.0, 2.5)]
    assert _overlaps([1.0, 2.0, 6.0], [3.5, 4.0], 1.0) == []


async def test_leader_partitioned_stalled_then_refused_never_two_acting() -> None:
    source = require_kubeconfig()
    host, port = _upstream(source)
    lease = f"qos-leader-test-{uuid.uuid4().hex[:8]}"
    proxies = {name: PausableProxy(host, port) for name in ("a", "b")}
    for p in proxies.values():
        await p.start()
    with tempfile.TemporaryDirectory(prefix="leader-") as tmp:
        work = Path(tmp)
        replicas = []
        for name, proxy in proxies.items():
            kubeconfig, _ = _proxied_kubeconfig(source, proxy.port, work / f"kubeconfig-{name}")
            replicas.append(Replica(f"replica-{name}", work, kubeconfig, lease))
        a, b = replicas
        api = await new_api_client(KubernetesConfig(kubeconfig=source))
        transitions, released = -1, ("?", False)
        try:
            await a.start()
            await _until(lambda: len(a.scans()) >= 3, "replica-a to lead and scan", 60, replicas)
            await b.start()
            await _until(lambda: b.said("autoscaler started") > 0, "replica-b to start", 60, replicas)
            await asyncio.sleep(LEASE_DURATION + 2)  # longer than the lease: a renews, b stands by
            assert b.scans() == [], "the standby scanned while the leader renewed"
            assert a.said("leading") == 1 and a.said("Lease renewal failed") == 0, a.raw[-10:]  # one steady term
            # the standby serves its probes and /metrics: Ready (synced), leader gauge 0; the leader's 1
            assert (await b.get("/readyz"))[0] == 200
            assert await a.leader_gauge() == 1 and await b.leader_gauge() == 0

            # 1. a's traffic stalls: a must stop at its renew deadline, b take over after the lease duration
            stalled_at = time.time()
            proxies["a"].pause()
            await _until(lambda: len(b.scans()) >= 3, "replica-b to take over from the stalled leader", 60, replicas)
            assert a.said("renew deadline passed: stopping") >= 1
            last_a = max(a.scans())
            # stopped by its own renew deadline, before its lease could expire (its last renewal was sent before
            # the stall, so the lease expires no earlier than stalled_at + LEASE_DURATION for anyone)
            assert last_a < stalled_at + LEASE_DURATION, (last_a - stalled_at, a.raw[-10:])
            await asyncio.sleep(2)
            proxies["a"].resume()  # its held bytes are delivered now: a late renewal must be refused (409)
            await asyncio.sleep(LEASE_DURATION + 2)
            assert max(a.scans()) == last_a, "the former leader acted again while b held the Lease"

            # 2. b's connections are reset and new ones refused: a takes over
            b_scans = len(b.scans())
            await proxies["b"].refuse()
            await _until(
                lambda: max(a.scans()) > last_a + 1, "replica-a to take over from the refused leader", 60, replicas
            )
            assert b.said("renew deadline passed: stopping") + b.said("lost the Lease") >= 1
            await proxies["b"].start()  # listening again on the same port
            await asyncio.sleep(LEASE_DURATION + 2)
            assert len(b.scans()) >= b_scans >= 3
        finally:
            for r in reversed(replicas):  # the standby first: no hand-over at the end (a releases as it stops)
                await r.stop()
            for p in proxies.values():
                await p.close()
            with contextlib.suppress(ApiException):
                lease_obj = await k8s.CoordinationV1Api(api).read_namespaced_lease(lease, "kube-system")
                transitions = lease_obj.spec.lease_transitions
                released = (lease_obj.spec.holder_identity or "", lease_obj.spec.acquire_time is not None)
                await k8s.CoordinationV1Api(api).delete_namespaced_lease(lease, "kube-system")
            await api.close()

        a_scans, b_scans_all = a.scans(), b.scans()
        assert len(a_scans) >= 6 and len(b_scans_all) >= 3
        merged = sorted([(t, "a") for t in a_scans] + [(t, "b") for t in b_scans_all])
        gaps = [round(t1 - t0, 3) for (t0, w0), (t1, w1) in itertools.pairwise(merged) if w0 != w1]
        print(f"hand-over gaps (s): {gaps}; scans a={len(a_scans)} b={len(b_scans_all)}")
        assert _overlaps(a_scans, b_scans_all, 1.0) == [], f"two replicas acted within the same second: {gaps}"
        assert len(gaps) == 2, gaps  # the leadership moved twice: a -> b (stalled) -> a (refused)
        assert transitions >= 2
        assert released == ("", True), released  # a's clean stop released it; acquireTime kept over renewals
