"""`helm install` on a cluster that has nothing of ours (issue 31): kind with our images in its nodes and nothing
deployed (hack/kind-up.sh with QOS_KIND_DEPLOY=none; phase 4 of hack/run-live-tests.sh), then EXACTLY the
commands of README.md's "Install on your cluster" block (between its install:begin / install:end markers),
read from the README and run one by one, with these checks between them:

- after `helm install` (default values): every part Ready with no Secret made by anyone but qos-certs (every
  Secret in our namespaces is qos-certs', a ServiceAccount token, or Helm's release record), the webhook's
  caBundle is qos-extender-tls's ca.crt, and a qos-scheduler pod is gated by the webhook and then bound by
  qos-scheduler (the API server -> webhook TLS path, the controller's release, kube-scheduler + extender);
- after `helm upgrade`: the injected caBundle and the certificates survived (Helm's three-way merge; the chart
  renders no caBundle), the change rolled out, and a new pod is still gated and bound;
- after `helm uninstall`, with a pod our gate holds (it fits no node): no pod carries our gate, and nothing of
  ours is left in the cluster (namespaces, cluster-scoped objects).

The only step that is not the README's: our image is given the name the chart deploys by default
(ghcr.io/kube-qos-extender/kube-qos-extender:<appVersion>) inside each node, the stand-in for pushing it to a
registry (none is reachable here). FAILS without the kind.env values (KUBECONFIG, KIND_CLUSTER, QOS_BIN_DIR).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import eventually

ROOT = Path(__file__).resolve().parent.parent
GATE = "qos.kube-qos-extender.io/ordering"
WEBHOOK = "qos-extender-ordering"
OURS = ("kube-qos-system", "kube-qos-agent")

pytestmark = [pytest.mark.live, pytest.mark.helm]


def readme_commands() -> list[str]:
    """The command lines of the README's install block (comments and blank lines dropped)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- install:begin -->\s*```sh\n(.*?)```\s*<!-- install:end -->", text, re.S)
    assert m, "README.md has no install block between <!-- install:begin --> and <!-- install:end -->"
    return [ln.split("  #")[0].strip() for ln in m.group(1).splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_readme_block_is_install_check_upgrade_uninstall() -> None:
    """The order the test below relies on: it runs these lines verbatim, so a README edit that changes their
    number or order fails here first, not halfway through a cluster run."""
    cmds = readme_commands()
    assert [shlex.split(c)[:2] for c in cmds] == [
        ["helm", "install"],
        ["kubectl", "-n"],
        ["helm", "upgrade"],
        ["helm", "uninstall"],
    ], cmds


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    missing = [k for k in ("KUBECONFIG", "KIND_CLUSTER", "QOS_BIN_DIR", "KIND") if not os.environ.get(k)]
    if missing or os.environ.get("QOS_KIND_DEPLOY") != "none":
        pytest.fail(
            f"needs a kind cluster with nothing of ours deployed: {missing or 'QOS_KIND_DEPLOY!=none'} "
            "(QOS_KIND_DEPLOY=none hack/kind-up.sh prints the values; hack/run-live-tests.sh phase 4)",
            pytrace=False,
        )
    out = dict(os.environ)
    out["PATH"] = f"{os.environ['QOS_BIN_DIR']}{os.pathsep}{os.environ.get('PATH', '')}"
    return out


def sh(env: dict[str, str], cmd: str, timeout: float = 900) -> str:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"$ {cmd}  ({time.monotonic() - t0:.1f} s, rc {proc.returncode})")
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def kj(env: dict[str, str], args: str) -> Any:
    return json.loads(sh(env, f"kubectl {args} -o json"))


def qos_pod(name: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"qos.kube-qos-extender.io/class": "silver"}},
        "spec": {
            "schedulerName": "qos-scheduler",
            "priorityClassName": "qos-silver",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10.1", "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }


def gated_then_bound(env: dict[str, str], ns: str, name: str) -> None:
    """Created through our webhook (the gate is only ever added at admission) and then bound by qos-scheduler."""
    sh(env, f"kubectl -n {ns} apply -f - <<'EOF'\n{json.dumps(qos_pod(name, '100m'))}\nEOF")
    pod = eventually(
        lambda: (p := kj(env, f"-n {ns} get pod {name}"))["spec"].get("nodeName") and p, f"pod {name} bound", 180
    )
    ann = pod["metadata"].get("annotations") or {}
    assert "qos.kube-qos-extender.io/controller" in ann, f"not admitted by our webhook: {ann}"
    assert "qos.kube-qos-extender.io/admission-bypassed" not in ann
    events = kj(env, f"-n {ns} get events --field-selector involvedObject.name={name}")["items"]
    scheduled = [e for e in events if e["reason"] == "Scheduled"]
    assert scheduled and all(
        "qos-scheduler" in (e.get("reportingComponent"), (e.get("source") or {}).get("component")) for e in scheduled
    ), scheduled


@pytest.fixture(scope="module")
def namespace(env: dict[str, str]) -> Iterator[str]:
    ns = f"helm-{uuid.uuid4().hex[:6]}"
    sh(env, f"kubectl create namespace {ns}")
    yield ns
    sh(env, f"kubectl delete namespace {ns} --wait=false")


def test_install_upgrade_uninstall_as_the_readme_says(env: dict[str, str], namespace: str) -> None:
    install, check, upgrade, uninstall = readme_commands()
    chart = yaml.safe_load((ROOT / "charts" / "kube-qos-extender" / "Chart.yaml").read_text())
    image = f"ghcr.io/kube-qos-extender/kube-qos-extender:{chart['appVersion']}"
    nodes = sh(env, f"{env['KIND']} get nodes --name {env['KIND_CLUSTER']}").split()
    tagged = []
    for node in nodes:  # the stand-in for `docker push` to a registry the nodes pull from (kind-up loads the workers)
        if "docker.io/library/kube-qos-extender:dev" in sh(env, f"docker exec {node} ctr -n k8s.io images ls -q"):
            sh(
                env,
                f"docker exec {node} ctr -n k8s.io images tag --force docker.io/library/kube-qos-extender:dev {image}",
            )
            tagged.append(node)
    assert tagged, f"our image is in none of {nodes}"

    t0 = time.monotonic()
    sh(env, install)
    print(f"helm install --wait: {time.monotonic() - t0:.0f} s")
    for kind, name, ns in (
        ("deploy", "qos-scheduler", "kube-qos-system"),
        ("deploy", "qos-certs", "kube-qos-system"),
        ("deploy", "qos-autoscaler", "kube-qos-system"),
        ("deploy", "qos-agent-issuer", "kube-qos-agent"),
        ("ds", "qos-agent", "kube-qos-agent"),
    ):
        sh(env, f"kubectl -n {ns} rollout status {kind}/{name} --timeout=120s")
    made = {line.split()[0] for line in sh(env, check).splitlines()[1:]}  # a header, then one line per Secret
    for ns in OURS:
        for s in kj(env, f"-n {ns} get secrets")["items"]:
            meta = s["metadata"]
            ours = (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") == "qos-certs"
            assert ours or s["type"] in ("kubernetes.io/service-account-token", "helm.sh/release.v1"), (
                f"Secret {ns}/{meta['name']} ({s['type']}) was not made by qos-certs"
            )
    assert {"qos-ca", "qos-extender-tls", "qos-extender-metrics-client", "qos-autoscaler-expander-tls"} <= made, made
    # qos-certs did all of it with its own least-privilege identity: no step failed, no Event was refused
    certs_log = sh(env, "kubectl -n kube-qos-system logs deploy/qos-certs")
    problems = [ln for ln in certs_log.splitlines() if '"level":"warning"' in ln or '"level":"error"' in ln]
    assert problems == [], problems
    tls = kj(env, "-n kube-qos-system get secret qos-extender-tls")
    hook = kj(env, f"get mutatingwebhookconfiguration {WEBHOOK}")
    assert [w["clientConfig"].get("caBundle") for w in hook["webhooks"]] == [tls["data"]["ca.crt"]]
    assert base64.b64decode(tls["data"]["ca.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
    gated_then_bound(env, namespace, "first")

    t0 = time.monotonic()
    sh(env, upgrade)
    print(f"helm upgrade --wait: {time.monotonic() - t0:.0f} s")
    hook = kj(env, f"get mutatingwebhookconfiguration {WEBHOOK}")
    assert [w["clientConfig"].get("caBundle") for w in hook["webhooks"]] == [tls["data"]["ca.crt"]]
    again = kj(env, "-n kube-qos-system get secret qos-extender-tls")
    assert again["data"] == tls["data"], "an upgrade must not reissue the certificates"
    values = json.loads(sh(env, "helm get values qos -o json"))
    replicas = kj(env, "-n kube-qos-system get deploy qos-scheduler")["spec"]["replicas"]
    assert replicas == values["scheduler"]["replicas"], (replicas, values)
    gated_then_bound(env, namespace, "second")

    # a pod our gate holds: it fits no node, so the controller never releases it
    big = qos_pod("never-fits", "500")
    sh(env, f"kubectl -n {namespace} apply -f - <<'EOF'\n{json.dumps(big)}\nEOF")
    pod = kj(env, f"-n {namespace} get pod never-fits")
    assert {"name": GATE} in (pod["spec"].get("schedulingGates") or []), pod["spec"].get("schedulingGates")
    t0 = time.monotonic()
    sh(env, uninstall)
    print(f"helm uninstall --wait: {time.monotonic() - t0:.0f} s")
    gated = [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in kj(env, "get pods -A")["items"]
        if {"name": GATE} in (p["spec"].get("schedulingGates") or [])
    ]
    assert gated == [], f"still behind our gate after uninstall: {gated}"

    def leftovers() -> list[str]:
        names = [
            f"{kind}/{d['metadata']['name']}"
            for kind in ("priorityclass", "clusterrole", "clusterrolebinding", "mutatingwebhookconfiguration")
            for d in kj(env, f"get {kind}")["items"]
            if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") == "kube-qos-extender"
        ]
        live = {n["metadata"]["name"] for n in kj(env, "get namespaces")["items"]}
        return names + [f"namespace/{n}" for n in OURS if n in live]

    eventually(lambda: not leftovers() or None, "nothing of ours left", 180)
