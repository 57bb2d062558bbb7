"""The container image (hack/build-image.sh: kube-qos-extender:dev, or $QOS_IMAGE) runs every subcommand.

Each command runs inside the image the way the Deployment runs it: user 65532 (the image's default), read-only
root filesystem with a tmpfs on /tmp, all capabilities dropped, no-new-privileges, --network host so that the
live cluster's API server on 127.0.0.1 is reachable. Configs, certificates and a self-contained copy of
$KUBECONFIG (files inlined as *-data) are mounted read-only at /etc/qos.

- ``simulate`` replays the built-in qos-validation1 workload and prints its report;
- ``serve`` (TLS, client certificates required for the verbs) answers /healthz and becomes ready: its snapshot
  synced with the live API server;
- ``autoscaler`` validates with the packaged autoscaler.yaml, and with the cluster-autoscaler provider (dry run,
  no Events: nothing in the cluster changes) syncs, scans and serves the gRPC expander from the stubs
  generated at build time (the read-only root filesystem proves nothing is generated at run time);
- ``agent`` (simulated backend, mTLS) answers /healthz to a client certificate of its CA;
- the image runs as uid 65532 and holds no compiler.

Marked live (it needs the cluster of the e2e run). Without docker, an engine or the image it FAILS, saying how
to build it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.live import require_kubeconfig
from tests.test_agent_support import free_port
from tests.test_wheel import (
    agent_config,
    expander_autoscaler_config,
    extender_config,
    http_get,
    pki,
    tls_handshake,
    wait_for,
)

pytestmark = [pytest.mark.live]

IMAGE = os.environ.get("QOS_IMAGE") or "kube-qos-extender:dev"
HOW = (
    "build it with `hack/build-image.sh` (= `make image`; on a fresh Debian machine it installs docker.io, "
    "starts its own dockerd and builds the images without any registry)"
)
MOUNT = "/etc/qos"
HARDENED = [
    "--network=host",
    "--read-only",
    "--tmpfs=/tmp:rw,nosuid,nodev,mode=1777",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
]


def _fail(msg: str) -> None:
    pytest.fail(msg, pytrace=False)


def docker(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        _fail(f"docker {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None:
        _fail(f"the image test needs the docker CLI (not on PATH): {HOW}")
    info = docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    if info.returncode != 0:
        _fail(f"no Docker engine answers `docker info` ({info.stderr.strip()}): {HOW}")
    if docker("image", "inspect", IMAGE).returncode != 0:
        _fail(f"image {IMAGE} is not in the Docker engine: {HOW}")
    return IMAGE


def flat_kubeconfig(src: str, dst: Path) -> Path:
    """$KUBECONFIG with its certificate and key files inlined (the container sees only the mounted folder)."""
    doc: dict[str, Any] = yaml.safe_load(Path(src).read_text())
    base = Path(src).resolve().parent

    def inline(section: dict[str, Any], key: str) -> None:
        if key in section:
            path = Path(section.pop(key))
            section[f"{key}-data"] = base64.b64encode((base / path).read_bytes()).decode()

    for c in doc.get("clusters") or []:
        inline(c["cluster"], "certificate-authority")
    for u in doc.get("users") or []:
        inline(u["user"], "client-certificate")
        inline(u["user"], "client-key")
    dst.write_text(yaml.safe_dump(doc))
    dst.chmod(0o644)
    return dst


@dataclass
class Mounted:
    """A host folder mounted read-only at /etc/qos: ``inside(name)`` is a file's path in the container."""

    dir: Path

    def inside(self, name: str) -> str:
        return f"{MOUNT}/{name}"

    @property
    def volume(self) -> str:
        return f"--volume={self.dir}:{MOUNT}:ro"


@pytest.fixture
def mounted(tmp_path: Path) -> Mounted:
    d = tmp_path / "etc-qos"
    d.mkdir()
    pki(d)  # ca.crt, server.crt/.key (SAN 127.0.0.1), client.crt/.key, ctl.crt/.key, all world-readable
    d.chmod(0o755)
    return Mounted(d)


def _publish(m: Mounted, path: Path) -> None:
    """Configs are written on the host with host paths replaced by their /etc/qos names."""
    text = path.read_text().replace(str(m.dir), MOUNT)
    path.write_text(text)
    path.chmod(0o644)


@dataclass
class Container:
    name: str

    def logs(self) -> str:
        r = docker("logs", self.name)
        return r.stdout + r.stderr

    def exited(self) -> str | None:
        r = docker("inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", self.name)
        running, _, code = r.stdout.strip().partition(" ")
        if running == "true":
            return None
        return f"container exited with {code}\n{self.logs()}"

    def stop(self) -> int:
        docker("stop", "-t", "20", self.name, timeout=60)
        r = docker("inspect", "-f", "{{.State.ExitCode}}", self.name)
        return int(r.stdout.strip() or -1)


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for c in started:
        docker("rm", "-f", c.name, timeout=60)


def start(image: str, containers: list[Container], m: Mounted, *args: str) -> Container:
    name = f"qos-e2e-image-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", f"--name={name}", *HARDENED, m.volume, image, *args, check=True)
    c = Container(name)
    containers.append(c)
    return c


# ------------------------------------------------------------------------------------------ tests


def test_image_runs_as_65532_without_a_compiler(image: str) -> None:
    user = docker("image", "inspect", "-f", "{{.Config.User}}", image, check=True).stdout.strip()
    assert user == "65532:65532", f"image user {user!r}"
    probe = (
        "import glob, json, os, shutil\n"
        "tools = ['gcc', 'cc', 'c++', 'g++', 'clang', 'clang++', 'tcc', 'cpp', 'as', 'ld', 'make']\n"
        "found = [shutil.which(t) for t in tools if shutil.which(t)]\n"
        "found += glob.glob('/usr/bin/*-gcc*') + glob.glob('/usr/lib/gcc/*/*/cc1*') + glob.glob('/usr/libexec/gcc')\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'compilers': found,\n"
        "                  'venv_writable': os.access('/opt/venv/lib', os.W_OK)}))"
    )
    r = docker("run", "--rm", *HARDENED, "--entrypoint=python3", image, "-c", probe, check=True)
    facts = json.loads(r.stdout)
    assert (facts["uid"], facts["gid"]) == (65532, 65532), facts
    assert facts["compilers"] == [], f"compiler/toolchain in the image: {facts['compilers']}"
    assert facts["venv_writable"] is False


def test_image_simulate(image: str) -> None:
    r = docker(
        "run", "--rm", *HARDENED, image, "simulate", "--workload", "qos-validation1", "--policy", "priority",
        timeout=300, check=True,
    )  # fmt: skip
    assert "policy" in r.stdout and "priority" in r.stdout and "gold" in r.stdout, r.stdout


def test_image_serve_syncs_with_the_cluster(image: str, mounted: Mounted, containers: list[Container]) -> None:
    m = mounted
    flat_kubeconfig(require_kubeconfig(), m.dir / "kubeconfig")
    port = free_port("127.0.0.1")
    # relative: /etc/qos; the test's client certificate (CN "client") is the scraper allowed on /metrics
    tls = {
        "cert_file": "server.crt",
        "key_file": "server.key",
        "client_ca_file": "ca.crt",
        "metrics_clients": ["client"],
    }
    _publish(m, extender_config(m.dir / "extender.yaml", port, m.inside("kubeconfig"), tls))
    c = start(image, containers, m, "serve", "--config", m.inside("extender.yaml"))
    ca = str(m.dir / "ca.crt")
    client = (str(m.dir / "client.crt"), str(m.dir / "client.key"))
    status, body = wait_for(lambda: http_get(f"https://127.0.0.1:{port}/healthz", ca=ca), "serve /healthz", c.exited)
    assert status == 200 and json.loads(body) == {"status": "ok"}

    def ready() -> str | None:
        r = http_get(f"https://127.0.0.1:{port}/readyz", ca=ca)
        return r[1] if r and r[0] == 200 else None

    assert json.loads(wait_for(ready, "serve /readyz (synced with the API server)", c.exited))["ready"] is True
    metrics = http_get(f"https://127.0.0.1:{port}/metrics", ca=ca, cert=client)
    assert metrics is not None and metrics[0] == 200 and "qos_extender" in metrics[1]
    assert http_get(f"https://127.0.0.1:{port}/metrics", ca=ca) != metrics  # no client certificate: refused
    assert c.stop() == 0, c.logs()


def test_image_autoscaler(image: str, mounted: Mounted, containers: list[Container]) -> None:
    m = mounted
    flat_kubeconfig(require_kubeconfig(), m.dir / "kubeconfig")
    _publish(m, extender_config(m.dir / "extender.yaml", 0, m.inside("kubeconfig")))
    # The packaged default autoscaler.yaml (no --autoscaler-config).
    r = docker(
        "run", "--rm", *HARDENED, m.volume, image, "autoscaler", "--config", m.inside("extender.yaml"),
        "--check-config", check=True,
    )  # fmt: skip
    assert "m1.large: cpu=4000m" in r.stdout and "provider=kwok" in r.stdout, r.stdout
    metrics, listen = free_port("127.0.0.1"), free_port("127.0.0.1")
    cfg = expander_autoscaler_config(
        m.dir / "autoscaler.yaml", metrics, listen, m.inside("server.crt"), m.inside("server.key")
    )
    _publish(m, cfg)
    c = start(
        image, containers, m, "autoscaler", "--config", m.inside("extender.yaml"),
        "--autoscaler-config", m.inside("autoscaler.yaml"),
    )  # fmt: skip
    wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/healthz"), "autoscaler /healthz", c.exited)

    def ready() -> str | None:
        r = http_get(f"http://127.0.0.1:{metrics}/readyz")
        return r[1] if r and r[0] == 200 else None

    wait_for(ready, "autoscaler /readyz (synced and scanned)", c.exited)
    assert tls_handshake(listen, str(m.dir / "ca.crt")) == "h2"  # the gRPC expander
    assert c.stop() == 0, c.logs()


def test_image_agent(image: str, mounted: Mounted, containers: list[Container]) -> None:
    m = mounted
    port = free_port("127.0.0.1")
    cfg = agent_config(
        m.dir / "agent.yaml",
        port,
        "/tmp/agent",  # the tmpfs: the root filesystem is read-only
        m.inside("server.crt"),
        m.inside("server.key"),
        m.inside("ca.crt"),
    )
    _publish(m, cfg)
    c = start(image, containers, m, "agent", "--config", m.inside("agent.yaml"))
    ca = str(m.dir / "ca.crt")
    client = (str(m.dir / "ctl.crt"), str(m.dir / "ctl.key"))  # the controller: the agent serves it /healthz
    status, body = wait_for(
        lambda: http_get(f"https://127.0.0.1:{port}/healthz", ca=ca, cert=client), "agent /healthz", c.exited
    )
    assert (status, body) == (200, "ok")
    assert c.stop() == 0, c.logs()
