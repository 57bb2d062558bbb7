"""`qos-extender serve` with `slack.enabled` (issue 16): the process started from a config file runs the slack
controller beside the extender, on the local cluster (real kube-apiserver, kwok, Prometheus scraping kwok's
emulated usage). The model file given in `slack.model_path` is loaded, the kwok service is classified from its
measured usage and its node gets the Eq. 3 batch capacity in its status, and the extender's /metrics carries
the qos_extender_slack_ metrics. The default file's `slack.enabled: false` publishes nothing (checked first).

With `slack.colocate.enabled` and the API server calling that process' admission webhook (a
MutatingWebhookConfiguration of the test's own, for its namespace only), a bronze batch pod annotated
`qos.kube-qos-extender.io/colocate: "true"` is stored with batch-cpu/batch-memory instead of cpu/memory and
qos-scheduler binds it through the cluster's extender on the published slack of a service node; a second one
no longer fits (default-scheduler's refusal names batch-cpu); a malformed value leaves
the pod as it was, with a Warning Event."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import MARKER
from e2e.kwok_usage import IMAGE, fixture_model, kwok_usage_node, service_pod, slack_test_settings
from extender.colocation.controller import BATCH_CPU, BATCH_MEMORY, save_model
from extender.core.model import memory_bytes
from extender.settings.extender import ExtenderConfig
from lab.kube_sync import Kube

pytestmark = [pytest.mark.live]

GI = 2**30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def env() -> Iterator[tuple[Kube, str, str, str]]:
    with kwok_usage_node("slsrv") as (kube, prom, rid, kubeconfig):
        node = f"{rid}-node"
        kube.create_pod(rid, service_pod(node))
        yield kube, prom, rid, kubeconfig


def _serve(config: dict[str, Any], path: Path) -> subprocess.Popen[bytes]:
    path.write_text(yaml.safe_dump(config))
    with (path.parent / "serve.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "extender.cli", "serve", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT
        )


def _metrics(port: int, tls: ssl.SSLContext | None = None) -> str:
    scheme = "https" if tls is not None else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/metrics", timeout=5, context=tls) as resp:
            text: str = resp.read().decode()
            return text
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_serve_runs_the_slack_controller_when_enabled(env: tuple[Kube, str, str, str], tmp_path: Path) -> None:
    kube, prom, ns, kubeconfig = env
    node = f"{ns}-node"
    base = ExtenderConfig().model_dump(mode="json", by_alias=True)
    base["kubernetes"]["kubeconfig"] = kubeconfig
    base["controller"]["enabled"] = False
    base["slack"].update(slack_test_settings(prom, tmp_path / "model.json", ns))
    save_model(tmp_path / "model.json", fixture_model())

    # the shipped default: off, nothing published even with a model at hand
    port = _free_port()
    proc = _serve(
        {**base, "server": {"host": "127.0.0.1", "port": port}, "slack": {**base["slack"]}}, tmp_path / "off.yaml"
    )
    try:
        kube.wait(lambda: "qos_extender_requests" in _metrics(port), "extender (slack off) serving", timeout=60)
        time.sleep(5)  # several refresh intervals, had it been on
        assert "qos_extender_slack_" not in _metrics(port)
        assert BATCH_CPU not in kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]
    finally:
        _stop(proc)

    base["slack"]["enabled"] = True
    port = _free_port()
    proc = _serve({**base, "server": {"host": "127.0.0.1", "port": port}}, tmp_path / "on.yaml")
    try:

        def published() -> bool:
            allocatable: dict[str, str] = kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]
            return allocatable.get(BATCH_CPU) == "1500" and allocatable.get(BATCH_MEMORY) == str(3 * GI)

        kube.wait(published, "1500 m / 3 GiB published by serve's slack controller", timeout=150, interval=2)
        text = _metrics(port)
        assert f'qos_extender_slack_published_batch_cpu_cores{{node="{node}"}} 1.5' in text
        assert 'qos_extender_slack_model_classes{resource="cpu"} 2.0' in text
        assert "qos_extender_slack_refresh_duration_seconds_count" in text
    finally:
        _stop(proc)
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-2000:]


def _needs(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        pytest.fail(f"{name} is not set: export the KEY=VALUE lines hack/local-up.sh prints", pytrace=False)
    return value


def test_serve_moves_opted_in_batch_pods_onto_the_slack(env: tuple[Kube, str, str, str], tmp_path: Path) -> None:
    kube, prom, ns, kubeconfig = env
    node = f"{ns}-node"
    ca, cert, key = _needs("EXTENDER_CA"), _needs("EXTENDER_SERVING_CERT"), _needs("EXTENDER_SERVING_KEY")
    tls = ssl.create_default_context(cafile=ca)
    tls.load_cert_chain(_needs("EXTENDER_CLIENT_CERT"), _needs("EXTENDER_CLIENT_KEY"))  # the metrics client
    config = ExtenderConfig().model_dump(mode="json", by_alias=True)
    config["kubernetes"]["kubeconfig"] = kubeconfig
    config["controller"]["enabled"] = False
    port = _free_port()
    config["server"] = {
        "host": "127.0.0.1",
        "port": port,
        "tls": {"cert_file": cert, "key_file": key, "client_ca_file": ca},
    }
    config["slack"].update(
        slack_test_settings(prom, tmp_path / "model.json", ns),
        enabled=True,
        colocate={"enabled": True, "classes": ["bronze"]},
    )
    save_model(tmp_path / "model.json", fixture_model())
    proc = _serve(config, tmp_path / "colocate.yaml")
    hook = f"{ns}-colocate"
    try:
        kube.wait(lambda: "qos_extender_requests" in _metrics(port, tls), "extender serving over TLS", timeout=60)
        kube.create(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": hook},
                "webhooks": [
                    {
                        "name": "colocate.e2e.qos.kube-qos-extender.io",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 10,
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/admission/mutate",
                            "caBundle": base64.b64encode(Path(ca).read_bytes()).decode(),
                        },
                        "rules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["pods"],
                                "scope": "Namespaced",
                            }
                        ],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    }
                ],
            },
        )

        def published() -> bool:
            allocatable: dict[str, str] = kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]
            return allocatable.get(BATCH_CPU) == "1500" and allocatable.get(BATCH_MEMORY) == str(3 * GI)

        kube.wait(published, "1500 m / 3 GiB published", timeout=150, interval=2)

        def batch(name: str, value: str, scheduler: str = "default-scheduler") -> dict[str, Any]:
            return {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "qos.kube-qos-extender.io/kind": "batch",
                        "qos.kube-qos-extender.io/class": "bronze",
                        "qos.kube-qos-extender.io/colocate": value,
                    },
                },
                "spec": {
                    "schedulerName": scheduler,
                    "nodeSelector": {"e2e-run": ns},
                    "tolerations": [{"key": "e2e-run", "operator": "Equal", "value": ns, "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {"name": "c", "image": IMAGE, "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
                    ],
                },
            }

        # the product path: qos-scheduler, the cluster's extender filtering on the published slack (the node is
        # in the service group, node_groups.enforce is on) and binding
        stored = kube.create_pod(ns, batch("moved-1", "true", "qos-scheduler"))
        want = {BATCH_CPU: 1000, BATCH_MEMORY: 2 * GI}  # the API server stores 1000 as its canonical "1k"
        res = stored["spec"]["containers"][0]["resources"]
        assert set(res) == {"requests", "limits"}
        for part in ("requests", "limits"):
            # + the routing marker the qos webhook adds to qos-scheduler pods (kube-scheduler then calls the extender)
            assert {k: memory_bytes(v) for k, v in res[part].items()} == {**want, MARKER: 1}, res
        kube.wait(
            lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/moved-1")["spec"].get("nodeName") == node,
            "moved-1 bound on the slack",
        )
        # 1000 + 1000 m > 1500 m published: the stock scheduler's refusal names the batch resource (under the QoS
        # controller a pod that fits nowhere stays gated instead, with no FailedScheduling to read)
        kube.create_pod(ns, batch("moved-2", "true"))

        def refused() -> bool:
            return any(
                e.get("reason") == "FailedScheduling"
                and e.get("involvedObject", {}).get("name") == "moved-2"
                and f"Insufficient {BATCH_CPU}" in e.get("message", "")
                for e in kube.events(ns)
            )

        kube.wait(refused, "moved-2 refused for lack of batch-cpu", timeout=60)
        bad = kube.create_pod(ns, batch("malformed", "yes"))
        assert bad["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}

        def warned() -> bool:
            return any(
                e.get("involvedObject", {}).get("name") == "malformed"
                and e.get("type") == "Warning"
                and "qos.kube-qos-extender.io/colocate" in e.get("message", "")
                for e in kube.events(ns)
            )

        kube.wait(warned, "a Warning Event on the malformed pod", timeout=60)
    finally:
        kube.request(
            "DELETE", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{hook}", ok=(200, 404)
        )
        _stop(proc)
