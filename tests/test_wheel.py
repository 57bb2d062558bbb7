"""The product as users install it: the built wheel, installed into a clean venv, runs every subcommand.

The wheel is built from a copy of the sources (pip wheel --no-deps, setuptools from pyproject's build-system),
checked for every data file the code reads at run time, and installed into a fresh venv whose dependencies
come from PyPI (pip's cache is reused). Every command then runs from that venv, with its working directory
in a temporary folder, a scrubbed environment (no PYTHONPATH, KUBECONFIG, QOS_*; HOME in tmp) and the
module path asserted to be inside the venv, so nothing is found through the source tree:

- ``simulate`` replays the built-in qos-validation1 workload (its CSV and hosts file are package data);
- ``serve`` gets past config loading and answers /healthz, /readyz says "not synced": its kubeconfig points at
  a closed 127.0.0.1 port;
- ``autoscaler`` with no --autoscaler-config (every default) validates and runs; with the
  cluster-autoscaler provider it generates the gRPC stubs from the packaged .proto files and serves them;
- ``agent`` refuses to start without mTLS, and starts with certificates made by openssl.

Slow (venv + pip, about a minute when pip's cache is warm) and needs PyPI or a warm pip cache: without them
it FAILS saying so. Helpers here are shared with e2e/test_image.py (the same commands inside the image).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.test_agent_support import CONTROLLER_CN, Pki, free_port, make_pki

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# Data files the code opens at run time (Path(__file__) / importlib.resources), beside the .proto files.
PACKAGE_DATA = (
    "extender/py.typed",
    "extender/sim/data/validation1.csv",
    "extender/sim/data/validation-20-hosts.txt",
)
PROTO_DIR = "extender/autoscaler/protos"
# Flavours for the autoscaler's catalogue (the minimal extender config has none of its own).
FLAVOURS = [
    {"name": "m1.medium", "cpu": "2", "memory": "8Gi", "pods": 110, "price_per_hour": 0.1371},
    {"name": "m1.large", "cpu": "4", "memory": "16Gi", "pods": 110, "price_per_hour": 0.2746},
]


# ------------------------------------------------------------------------------------------ shared helpers


def source_data_files() -> set[str]:
    """Every non-Python file of the package in the source tree except docs (README/ORIGIN .md)."""
    out = set()
    for p in (ROOT / "extender").rglob("*"):
        if p.is_file() and p.suffix not in (".py", ".pyc", ".md") and "__pycache__" not in p.parts:
            out.add(p.relative_to(ROOT).as_posix())
    return out


def closed_port_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server is a 127.0.0.1 port nobody listens on."""
    port = free_port("127.0.0.1")
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "closed", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "nobody", "user": {"token": "not-a-token"}}],
        "contexts": [{"name": "closed", "context": {"cluster": "closed", "user": "nobody"}}],
        "current-context": "closed",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def extender_config(path: Path, port: int, kubeconfig: str, tls: dict[str, Any] | None = None) -> Path:
    """A minimal valid extender config: server on 127.0.0.1:port, the given kubeconfig, two flavours."""
    server: dict[str, Any] = {"host": "127.0.0.1", "port": port}
    if tls:
        server["tls"] = tls
    doc = {"server": server, "kubernetes": {"kubeconfig": kubeconfig, "events": False}, "flavours": FLAVOURS}
    path.write_text(yaml.safe_dump(doc))
    return path


def expander_autoscaler_config(path: Path, metrics_port: int, listen_port: int, cert: str, key: str) -> Path:
    """provider cluster-autoscaler: the loop runs dry, the gRPC expander (generated stubs) serves TLS."""
    doc = {
        "autoscaler": {
            "provider": "cluster-autoscaler",
            "metrics": {"host": "127.0.0.1", "port": metrics_port},
            "cluster_autoscaler": {"listen": f"127.0.0.1:{listen_port}", "cert_file": cert, "key_file": key},
        }
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def agent_config(path: Path, port: int, state_dir: str, cert: str, key: str, ca: str) -> Path:
    doc = {
        "agent": {
            "host": "127.0.0.1",
            "port": port,
            "node_name": "wheel-test-node",
            "state_dir": state_dir,
            "backend": "simulated",
            "simulated_store": "memory",
            "events": False,
            "tls": {"cert_file": cert, "key_file": key, "ca_file": ca},
        }
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def pki(d: Path) -> Pki:
    """CA + a 127.0.0.1 server cert ("server") + client certs: "client" (CN client) and "ctl" (the controller's
    identity, which the agent answers /healthz), world-readable (containers)."""
    p = make_pki(d, {"server": "127.0.0.1", "client": "", "ctl": ""}, {"ctl": CONTROLLER_CN})
    d.chmod(0o755)
    for f in d.iterdir():
        f.chmod(0o644)
    return p


def http_get(url: str, *, ca: str | None = None, cert: tuple[str, str] | None = None) -> tuple[int, str] | None:
    """(status, body), or None while nothing answers."""
    ctx = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(*cert)
    try:
        with urllib.request.urlopen(url, timeout=3, context=ctx) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def tls_handshake(port: int, ca: str) -> str:
    """Complete a TLS handshake with 127.0.0.1:port (verified against ca); returns the negotiated ALPN or ''."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        return s.selected_alpn_protocol() or ""


def wait_for(probe: Callable[[], T | None], what: str, alive: Callable[[], str | None], timeout: float = 90.0) -> T:
    """Poll ``probe`` until it returns a value; ``alive`` returns the process's output once it has exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        dead = alive()
        if dead is not None:
            pytest.fail(f"exited before {what}:\n{dead}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s", pytrace=False)
        time.sleep(0.25)


# ------------------------------------------------------------------------------------------ the installed wheel


@dataclass
class Installed:
    wheel: Path
    venv: Path
    env: dict[str, str]
    cwd: Path
    tmp: Path

    @property
    def cli(self) -> str:
        return str(self.venv / "bin" / "qos-extender")

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.cli, *args], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self, name: str, *args: str) -> Daemon:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([self.cli, *args], cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return Daemon(proc, log)


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def exited(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"exit code {self.proc.returncode}\n{self.output()}"

    def stop(self) -> int:
        """SIGTERM, as the kubelet would; the exit code (killed after 20 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def _pip(args: list[str], what: str, timeout: float = 900) -> None:
    try:
        subprocess.run(args, check=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.CalledProcessError as exc:
        pytest.fail(
            f"{what} failed (this test needs PyPI, or pip's cache warm with the pinned dependencies and "
            f"setuptools; it does not skip offline):\n$ {' '.join(args)}\n{exc.stdout[-3000:]}{exc.stderr[-3000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    # A copy of what the wheel is made from: no stale build/ or egg-info of the working tree gets in.
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "extender", src / "extender", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    _pip([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], "building the wheel")
    (wheel,) = dist.glob("kube_qos_extender-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _pip([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], "installing the wheel")
    cwd = tmp / "run"  # no extender/ here: nothing importable from the working directory
    (tmp / "home").mkdir()
    cwd.mkdir()
    scrub = ("PYTHON", "VIRTUAL_ENV", "QOS_", "KUBECONFIG", "PIP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(scrub)}
    env.update(
        HOME=str(tmp / "home"),
        QOS_CACHE=str(tmp / "cache"),
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    yield Installed(wheel, venv, env, cwd, tmp)


# ------------------------------------------------------------------------------------------ tests


def test_wheel_contains_package_data(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    missing = [n for n in PACKAGE_DATA if n not in names]
    assert not missing, f"{installed.wheel.name} lacks {missing}: fix [tool.setuptools.package-data] in pyproject.toml"
    protos = {p.relative_to(ROOT).as_posix() for p in (ROOT / PROTO_DIR).rglob("*.proto")}
    assert protos, f"no .proto files under {PROTO_DIR}"
    assert protos <= names, f"{installed.wheel.name} lacks the .proto files {sorted(protos - names)}"
    # The gRPC stubs are generated when the wheel is built (setup.py), typed by their .pyi
    for stem in ("expander", "externalgrpc", "k8s_core_v1_minimal"):
        assert {f"{PROTO_DIR}/{stem}_pb2.py", f"{PROTO_DIR}/{stem}_pb2.pyi"} <= names, stem
    assert {f"{PROTO_DIR}/expander_pb2_grpc.py", f"{PROTO_DIR}/externalgrpc_pb2_grpc.pyi"} <= names
    # Any other data file added to the package later must be listed in package-data too.
    assert source_data_files() <= names, f"not in the wheel: {sorted(source_data_files() - names)}"


def test_runs_from_the_venv_not_the_source_tree(installed: Installed) -> None:
    code = (
        "import json, importlib.util, extender, extender.cli, extender.settings.extender as c\n"
        "import extender.autoscaler.stubs as p\n"
        "assert p.load_externalgrpc().pb2.NodeGroupsResponse().SerializeToString() == b''\n"
        "assert importlib.util.find_spec('grpc_tools') is None, 'grpcio-tools is a build requirement only'\n"
        "print(json.dumps([extender.__file__, str(c.FLAVOURS_PATH), str(p.PROTO_DIR)]))"
    )
    out = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", code],
        cwd=installed.cwd,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    module, flavours_yaml, protos = (Path(p) for p in json.loads(out.stdout))
    site = installed.venv.resolve()
    assert module.resolve().is_relative_to(site), f"extender imported from {module}, not from {site}"
    assert not module.resolve().is_relative_to(ROOT)
    assert Path(flavours_yaml).is_file() and Path(flavours_yaml).is_relative_to(site)
    assert list(Path(protos).rglob("*.proto"))


def test_simulate(installed: Installed) -> None:
    report = installed.cwd / "sim.json"
    r = installed.run("simulate", "--workload", "qos-validation1", "--policy", "priority", "--json", str(report))
    assert r.returncode == 0, r.stderr
    assert "priority" in r.stdout and "gold" in r.stdout, r.stdout
    doc = json.loads(report.read_text())
    assert doc["workload"] == "qos-validation1"
    assert [run["policy"] for run in doc["runs"]] == ["priority"]


def test_serve_gets_past_config(installed: Installed) -> None:
    kubeconfig = closed_port_kubeconfig(installed.tmp / "closed.kubeconfig")
    port = free_port("127.0.0.1")
    cfg = extender_config(installed.tmp / "serve.yaml", port, str(kubeconfig))
    d = installed.start("serve", "serve", "--config", str(cfg))
    try:
        status, body = wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz"), "serve /healthz", d.exited)
        assert status == 200 and json.loads(body) == {"status": "ok"}
        # Not synced: its API server (the closed port) never answers; that is the only thing missing.
        status, body = http_get(f"http://127.0.0.1:{port}/readyz") or (0, "")
        assert status == 503 and json.loads(body)["ready"] is False, body
    finally:
        rc = d.stop()
    assert rc == 0, d.output()


def test_autoscaler_default_config(installed: Installed) -> None:
    """No --autoscaler-config: every default, validated and run."""
    kubeconfig = closed_port_kubeconfig(installed.tmp / "closed-as.kubeconfig")
    cfg = extender_config(installed.tmp / "autoscaler-extender.yaml", 0, str(kubeconfig))
    r = installed.run("autoscaler", "--config", str(cfg), "--check-config")
    assert r.returncode == 0, r.stderr
    assert "m1.large: cpu=4000m" in r.stdout and "provider=kwok" in r.stdout, r.stdout
    port = free_port("127.0.0.1")
    d = installed.start("autoscaler-kwok", "autoscaler", "--config", str(cfg), "--metrics-port", str(port))
    try:
        status, body = wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz"), "/healthz", d.exited)
        assert (status, body) == (200, "ok")
        assert (http_get(f"http://127.0.0.1:{port}/readyz") or (0, ""))[0] == 503  # never synced: closed port
    finally:
        rc = d.stop()
    assert rc == 0, d.output()


def test_autoscaler_serves_the_expander_from_the_built_stubs(installed: Installed) -> None:
    certs = pki(installed.tmp / "pki-as")
    kubeconfig = closed_port_kubeconfig(installed.tmp / "closed-ca.kubeconfig")
    cfg = extender_config(installed.tmp / "ca-extender.yaml", 0, str(kubeconfig))
    metrics, listen = free_port("127.0.0.1"), free_port("127.0.0.1")
    scfg = expander_autoscaler_config(
        installed.tmp / "ca-autoscaler.yaml",
        metrics,
        listen,
        str(certs.dir / "server.crt"),
        str(certs.dir / "server.key"),
    )
    d = installed.start("autoscaler-ca", "autoscaler", "--config", str(cfg), "--autoscaler-config", str(scfg))
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/healthz"), "/healthz", d.exited)
        assert tls_handshake(listen, str(certs.ca)) == "h2"  # the gRPC expander answers
    finally:
        rc = d.stop()
    assert rc == 0, d.output()
    # nothing is generated at run time any more: the stubs came with the wheel
    assert not (Path(installed.env["QOS_CACHE"]) / "protos").exists()


def test_agent_requires_mtls_and_starts_with_it(installed: Installed) -> None:
    state = installed.tmp / "agent-state"
    r = installed.run("agent", "--backend", "simulated", "--state-dir", str(state), "--port", "0")
    assert r.returncode == 2 and "mTLS" in r.stderr, r.stderr
    certs = pki(installed.tmp / "pki-agent")
    port = free_port("127.0.0.1")
    cfg = agent_config(
        installed.tmp / "agent.yaml",
        port,
        str(state),
        str(certs.dir / "server.crt"),
        str(certs.dir / "server.key"),
        str(certs.ca),
    )
    d = installed.start("agent", "agent", "--config", str(cfg))
    client = (str(certs.dir / "ctl.crt"), str(certs.dir / "ctl.key"))  # the controller: the agent serves it /healthz
    try:
        status, body = wait_for(
            lambda: http_get(f"https://127.0.0.1:{port}/healthz", ca=str(certs.ca), cert=client),
            "agent /healthz",
            d.exited,
        )
        assert (status, body) == (200, "ok")
        assert http_get(f"https://127.0.0.1:{port}/healthz", ca=str(certs.ca)) is None  # no client cert: refused
    finally:
        rc = d.stop()
    assert rc == 0, d.output()


def test_default_extender_config_when_installed(installed: Installed) -> None:
    r = installed.run("autoscaler", "--check-config")
    assert r.returncode == 0, r.stderr
