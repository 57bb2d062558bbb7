"""The real cluster-autoscaler 1.35.2 for e2e tests: its binaries (hack/build-ca.sh), its ProvisioningRequest CRD,
the kwok cloud provider's ConfigMaps (the local stand-in for a cloud's node groups), and one CA process per test.

Nothing here replays CA: the binaries are built from the unmodified release source in ../shared/vendor. A missing
binary fails the test with the command that builds it (never a skip)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from extender.core.model import Flavour, Resources

GI = 2**30
# the catalogue of the CA e2e tests: one balanced, one cpu-heavy, one memory-heavy flavour
FLAVOURS = (
    Flavour("e2e.std", Resources(2000, 4 * GI, 110), 0.10),
    Flavour("e2e.cpu", Resources(4000, 4 * GI, 110), 0.16),
    Flavour("e2e.mem", Resources(1000, 8 * GI, 110), 0.12),
)
ROOT = Path(__file__).resolve().parents[1]
NODE_GROUP_LABEL = "qos.kube-qos-extender.io/ca-node-group"  # the kwok provider's fromNodeLabelKey


def _versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def pki(d: Path) -> dict[str, Path]:
    """A CA, a serving certificate for 127.0.0.1 (the expander, the cloud provider) and a client certificate
    (CA's externalgrpc client, CN cluster-autoscaler: the sidecar's default cloud_provider.clients), all EC P-256,
    valid a day."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.crt", "-days", "1", "-subj", "/CN=e2e-ca")
    for leaf, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        cn = "cluster-autoscaler" if leaf == "client" else leaf  # the identity the cloud provider allows
        _openssl("req", *ec, "-keyout", d / f"{leaf}.key", "-out", d / f"{leaf}.csr", "-subj", f"/CN={cn}")
        (d / f"{leaf}.ext").write_text(ext)
        _openssl(
            "x509", "-req", "-in", d / f"{leaf}.csr", "-CA", d / "ca.crt", "-CAkey", d / "ca.key", "-CAcreateserial",
            "-out", d / f"{leaf}.crt", "-days", "1", "-extfile", d / f"{leaf}.ext",
        )  # fmt: skip
    return {name: d / name for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def tool_dirs() -> tuple[Path, Path]:
    cache = Path(os.environ.get("QOS_CACHE") or Path.home() / ".cache" / "kube-qos-extender")
    base = cache / _versions()["KUBE_VERSION"]
    return base / "bin", base / "share"


def ca_binary(tag: str) -> Path:
    path = tool_dirs()[0] / f"cluster-autoscaler-{tag}"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} missing: build the real cluster-autoscaler with hack/build-ca.sh (make tools)", pytrace=False
        )
    return path


def kubectl(*args: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run(
        [str(tool_dirs()[0] / "kubectl"), *args], input=stdin, capture_output=True, check=False, timeout=60
    )
    if proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode()


def apply_provisioning_request_crd() -> None:
    """CA's own CRD of the release we run (copied to the cache by hack/build-ca.sh), established."""
    crd = tool_dirs()[1] / "provisioningrequests.autoscaling.x-k8s.io.yaml"
    if not crd.is_file():
        pytest.fail(f"{crd} missing: run hack/build-ca.sh", pytrace=False)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/provisioningrequests.autoscaling.x-k8s.io")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kwok_templates(flavours: Sequence[Flavour], groups: Sequence[str], max_count: int = 10) -> list[dict[str, Any]]:
    """One template Node per (group, flavour): what a cloud's node group of that instance type would register
    (the node-group label our extender filters by, the instance type, the price annotation)."""
    out = []
    for group in groups:
        for f in flavours:
            cap = {
                "cpu": f"{f.capacity.cpu_milli}m",
                "memory": str(f.capacity.memory_bytes),
                "pods": str(f.capacity.pods),
            }
            name = f"{group}-{f.name.replace('.', '-')}"
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {
                            "cluster-autoscaler.kwok.nodegroup/max-count": str(max_count),
                            "qos.kube-qos-extender.io/price-per-hour": repr(f.price_per_hour),
                        },
                        "labels": {
                            NODE_GROUP_LABEL: name,
                            "qos.kube-qos-extender.io/node-group": group,
                            "node.kubernetes.io/instance-type": f.name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                        },
                    },
                    "spec": {},
                    "status": {
                        "allocatable": cap,
                        "capacity": cap,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    },
                }
            )
    return out


def kwok_provider_configmaps(namespace: str, templates: list[dict[str, Any]]) -> None:
    config = {
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeLabelKey": NODE_GROUP_LABEL},
        "nodes": {"skipTaint": True},
        "configmap": {"name": "kwok-provider-templates"},
    }
    items = {"apiVersion": "v1", "kind": "List", "items": templates}
    for name, key, data in (
        ("kwok-provider-config", "config", config),
        ("kwok-provider-templates", "templates", items),
    ):
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {key: orjson.dumps(data).decode()},
        }
        kubectl("apply", "-f", "-", stdin=orjson.dumps(body))


@contextlib.contextmanager
def cluster_autoscaler(
    tag: str, namespace: str, kubeconfig: str, log_path: Path, extra: Sequence[str]
) -> Iterator[subprocess.Popen[bytes]]:
    """The real CA, fast for a test: 1 s loops, empty nodes removed 10 s after they are unneeded."""
    args = [
        str(ca_binary(tag)),
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        f"--address=127.0.0.1:{free_port()}",
        "--leader-elect=false",
        "--scan-interval=1s",
        "--enable-provisioning-requests",
        "--scale-down-delay-after-add=0s",
        "--scale-down-delay-after-delete=0s",
        "--scale-down-delay-after-failure=5s",
        "--scale-down-unneeded-time=10s",
        "--unremovable-node-recheck-timeout=5s",
        "--max-node-provision-time=3m",
        "--balance-similar-node-groups=false",
        "--skip-nodes-with-local-storage=false",
        "--v=4",
        *extra,
    ]
    env = {**os.environ, "KUBECONFIG": kubeconfig, "POD_NAMESPACE": namespace, "KWOK_PROVIDER_MODE": "local"}
    with log_path.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        time.sleep(1.0)
        if proc.poll() is not None:
            raise AssertionError(f"cluster-autoscaler exited {proc.returncode}: {log_path.read_text()[-3000:]}")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
