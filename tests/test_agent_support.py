"""Shared machinery of the agent tests (no tests here): throwaway mTLS PKI, agent processes, counter processes.

Agents run as real ``python -m extender.cli agent`` processes on 127.0.0.1 / 127.0.0.2 so "agent killed" is a
real SIGKILL; a supervisor thread restarts a dead agent like a DaemonSet would. The workload is a counter
process (setsid, stdin /dev/null) appending 1, 2, 3 ... to a file: the file must stay exactly consecutive
(nothing lost, nothing done twice) and exactly one process with its marker may exist.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from extender.agent.client import AgentClient, PeerError
from extender.agent.settings import AgentTlsConfig, find_criu

REPO = Path(__file__).resolve().parents[1]

COUNTER_SRC = r"""
import os, sys, time
path = sys.argv[2]
i = 0
while True:
    i += 1
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"%d\n" % i)
    os.close(fd)
    time.sleep(0.01)
"""


# ------------------------------------------------------------------ CRIU
def require_criu() -> str:
    """The criu binary, after `criu check` said it works. FAILS (never skips) otherwise."""
    criu = find_criu()
    if criu is None:
        pytest.fail("criu not found: run hack/build-criu.sh (or set QOS_CRIU); the agent suite needs CRIU >= 4.1")
    out = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60)
    text = (out.stdout + out.stderr).strip()
    if out.returncode != 0 or "Looks good" not in text:
        pytest.fail(f"`{criu} check` failed (exit {out.returncode}):\n{text}")
    return criu


# ------------------------------------------------------------------ PKI
@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path

    def tls(self, name: str) -> AgentTlsConfig:
        return AgentTlsConfig(
            cert_file=str(self.dir / f"{name}.crt"), key_file=str(self.dir / f"{name}.key"), ca_file=str(self.ca)
        )


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


# The identities the agents' routes know (extender/agent/authz.py): the controller's CN, and an agent's
# ``qos-agent:<node>``. ``make_pki`` gives the files "ctl" and "prom" the controller's and the scraper's CNs by default.
CONTROLLER_CN = "qos-autoscaler-consolidation"
METRICS_CN = "qos-agent-metrics"  # the scraper's: /metrics only


def make_pki(d: Path, names: dict[str, str], subjects: dict[str, str] | None = None) -> Pki:
    """A throwaway CA and one cert per name (value: IP SAN, or '' for a client-only cert), via the openssl CLI.
    ``subjects``: the CN of a name's certificate (default: the name; "ctl", "prom": the controller's, the scraper's)."""
    cns = {"ctl": CONTROLLER_CN, "prom": METRICS_CN, **(subjects or {})}
    d.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=qos-agent-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-out", "ca.crt", cwd=d)  # fmt: skip
    for name, ip in names.items():
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={cns.get(name, name)}", "-out",
                 f"{name}.csr", cwd=d)  # fmt: skip
        ext = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
               "extendedKeyUsage=serverAuth,clientAuth"]  # fmt: skip
        if ip:
            ext.append(f"subjectAltName=IP:{ip}")
        (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)  # fmt: skip
    return Pki(d, d / "ca.crt")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ agents
@dataclass
class AgentProc:
    name: str
    host: str
    port: int
    state_dir: Path
    tls: AgentTlsConfig
    log: Path
    backend: str = "criu"
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    supervise: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: bool = False
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def _spawn(self) -> None:
        assert self.tls.cert_file and self.tls.key_file and self.tls.ca_file
        argv = [sys.executable, "-m", "extender.cli", "agent", "--host", self.host, "--port", str(self.port),
                "--node-name", self.name, "--state-dir", str(self.state_dir), "--backend", self.backend,
                "--tls-cert", self.tls.cert_file, "--tls-key", self.tls.key_file, "--tls-ca", self.tls.ca_file,
                "--enable-test-fault-injection", *self.extra]  # fmt: skip
        logf = self.log.open("ab")
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        logf.close()

    def start(self) -> None:
        self._spawn()
        self._thread = threading.Thread(target=self._supervisor, daemon=True)
        self._thread.start()

    def _supervisor(self) -> None:
        while not self._stop:
            proc = self.proc
            assert proc is not None
            proc.wait()
            if self._stop or not self.supervise:
                return
            time.sleep(0.05)
            with self._lock:
                if self._stop:
                    return
                self.restarts += 1
                self._spawn()

    def stop(self) -> None:
        self._stop = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


async def wait_ready(client: AgentClient, agent: AgentProc, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            info = await client.request("GET", f"{agent.url}/v1/info", timeout=2)
            health = await client.request("GET", f"{agent.url}/healthz", timeout=2)
            del health
            return info
        except PeerError as exc:
            last = exc.reason
        await _sleep(0.05)
    raise AssertionError(f"agent {agent.name} not ready after {timeout}s ({last}):\n{agent.log_tail()}")


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


# ------------------------------------------------------------------ the workload
@dataclass
class Counter:
    marker: str
    path: Path
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def values(self) -> list[int]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        # the last line may be partial while being written
        return [int(x) for x in lines[:-1] if x]


def start_counter(d: Path) -> Counter:
    marker = f"qos-agent-counter-{uuid.uuid4().hex[:12]}"
    path = d / f"{marker}.log"
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-S", "-c", COUNTER_SRC, marker, str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # setsid: a session leader, so criu needs no --shell-job
        close_fds=True,
    )
    # reap it the moment it dies (a zombie holds its PID, which the restore needs)
    threading.Thread(target=proc.wait, daemon=True).start()
    deadline = time.monotonic() + 5
    c = Counter(marker, path, proc)
    while len(c.values()) < 3:
        assert time.monotonic() < deadline, "counter did not start"
        time.sleep(0.01)
    return c


def marker_pids(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line holds ``marker``."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        if marker.encode() in cmd and stat[stat.rfind(")") + 2] not in "ZX":
            out.append(int(entry.name))
    return out


def kill_marker(marker: str) -> None:
    for pid in marker_pids(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def check_consecutive(values: list[int]) -> None:
    """1, 2, 3, ... n: nothing lost (no gap) and nothing done twice (no repeat)."""
    assert values, "counter wrote nothing"
    assert values[0] == 1, values[:5]
    bad = [(a, b) for a, b in itertools.pairwise(values) if b != a + 1]
    assert not bad, f"counter sequence broken at {bad[:5]} (len {len(values)})"


async def assert_runs_once_and_progresses(counter: Counter, *, since: int, timeout: float = 10.0) -> list[int]:
    """Exactly one live process carries the marker, and the counter grows past ``since`` consecutively."""
    deadline = time.monotonic() + timeout
    pids = marker_pids(counter.marker)
    while len(pids) != 1 and time.monotonic() < deadline:
        await _sleep(0.05)
        pids = marker_pids(counter.marker)
    assert len(pids) == 1, f"expected exactly one running copy, found {pids}"
    while time.monotonic() < deadline:
        vals = counter.values()
        if vals and vals[-1] >= since + 5:
            break
        await _sleep(0.02)
    vals = counter.values()
    assert vals and vals[-1] >= since + 5, f"counter stopped at {vals[-1:]} (checkpointed at >= {since})"
    check_consecutive(vals)
    assert len(marker_pids(counter.marker)) == 1
    return vals


# ------------------------------------------------------------------ in-process agents
async def serve_in_process(agent: Any, host: str = "127.0.0.1") -> tuple[Any, str]:
    """Run an ``Agent`` in this event loop on ``host``:<free port>; returns (runner, base URL)."""
    from aiohttp import web

    from extender.agent.server import make_app, server_ssl_context

    runner = web.AppRunner(make_app(agent), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=server_ssl_context(agent.config))
    await site.start()
    server: Any = site._server
    port = server.sockets[0].getsockname()[1]
    agent.ready = True
    scheme = "https" if agent.config.tls.enabled else "http"
    return runner, f"{scheme}://{host}:{port}"
