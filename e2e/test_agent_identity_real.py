"""Least privilege of the node agents on real kubelet nodes, as deployed (issue #29): who may call what on an agent,
what an agent refuses to checkpoint and where it refuses to send it, and what one node's credentials can do on
another node.

The cluster and the product are e2e/test_deployed.py's (``product``: config/local applied by hack/deploy-local.sh,
the agents' identities issued by qos-agent-issuer through the CSR API). Identities used here, as a user's cluster
holds them: the controller's client certificate (AGENT_CLIENT_CERT, CN qos-autoscaler-consolidation), Prometheus'
(AGENT_METRICS_CERT, CN qos-agent-metrics), and an agent's own certificates read out of its pod (``kubectl exec``:
what an attacker who took over that agent holds).

Runs with ``-m deployed`` (hack/run-live-tests.sh phase 2); fails, never skips, without that cluster.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e.test_deployed import AGENT_NS, BUSYBOX, Product, namespace, product  # noqa: F401  (fixtures)
from e2e.test_migration_real import _group_nodes

pytestmark = [pytest.mark.live, pytest.mark.deployed]

# Every route of the agent (extender/agent/server.py make_app), with a body its handler would accept.
ROUTES: list[tuple[str, str, Any]] = [
    ("POST", "/v1/migrations", {"workload": {"namespace": "x", "pod": "y"}, "destination": {"url": "https://a:1"}}),
    ("GET", "/v1/migrations/authz-1", None),
    ("PUT", "/v1/migrations/authz-1/archive/final", None),
    ("POST", "/v1/migrations/authz-1/prepare", {"meta": {}}),
    ("POST", "/v1/migrations/authz-1/restore", {"meta": {}}),
    ("POST", "/v1/migrations/authz-1/commit", {}),
    ("POST", "/v1/migrations/authz-1/abort", {}),
    ("POST", "/v1/migrations/authz-1/discard", {}),
    ("GET", "/v1/info", None),
    ("GET", "/healthz", None),
    ("PUT", "/v1/test/faults", {"faults": {}}),
    ("GET", "/v1/test/faults", None),
    ("GET", "/metrics", None),
]


def _ip(p: Product, node: str) -> str:
    addresses = p.kube.get(f"/api/v1/nodes/{node}")["status"]["addresses"]
    return str(next(a["address"] for a in addresses if a["type"] == "InternalIP"))


def _ctx(ca: str, cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    return ctx


def _call(ctx: ssl.SSLContext, method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, str]:
    headers: dict[str, str] = {}
    data: bytes | None = None
    if "/archive/" in url:
        data, headers = b"x" * 10, {"X-Qos-Archive-Size": "10", "X-Qos-Archive-Sha256": "0" * 64}
    elif body is not None:
        data, headers = json.dumps(body).encode(), {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _pod(name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"],
                    "resources": {"requests": {"cpu": "10m", "memory": "8Mi"}},
                }
            ],
        },
    }


def _running(p: Product, ns: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        pod = p.kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        statuses = pod.get("status", {}).get("containerStatuses") or []
        return pod if statuses and "running" in statuses[0].get("state", {}) else None

    result: dict[str, Any] = p.kube.wait(check, f"pod {ns}/{name} running", timeout=90, interval=0.5)
    return result


def _checkpoints(p: Product, node: str) -> list[str]:
    return p.node_ls(node, p.node_dir(node, "kubelet-checkpoints")) or []


def _agent_pod(p: Product, node: str) -> str:
    pods = [x for x in p.kube.pods(AGENT_NS) if x["spec"].get("nodeName") == node
            and x["metadata"]["name"].startswith("qos-agent-") and "issuer" not in x["metadata"]["name"]]  # fmt: skip
    assert len(pods) == 1, [x["metadata"]["name"] for x in pods]
    return str(pods[0]["metadata"]["name"])


def _steal(p: Product, node: str, dest: Path) -> dict[str, Path]:
    """The node agent's certificates and keys, read from inside its pod: what a compromised agent holds."""
    dest.mkdir(parents=True, exist_ok=True)
    pod = _agent_pod(p, node)
    out: dict[str, Path] = {}
    for f in ("tls.crt", "tls.key", "kubelet.crt", "kubelet.key"):
        got = subprocess.run([str(p.bin_dir / "kubectl"), "exec", "-n", AGENT_NS, pod, "-c", "agent", "--", "cat",
                              f"/run/qos-agent/identity/{f}"], env=p.env, capture_output=True, timeout=60)  # fmt: skip
        assert got.returncode == 0, got.stderr.decode()[-2000:]
        (dest / f).write_bytes(got.stdout)
        out[f] = dest / f
    return out


def test_authz_prometheus_identity_reads_metrics_and_nothing_else(product: Product) -> None:  # noqa: F811
    env = product.env
    prom = _ctx(env["AGENT_CA"], env["AGENT_METRICS_CERT"], env["AGENT_METRICS_KEY"])
    ctl = _ctx(env["AGENT_CA"], env["AGENT_CLIENT_CERT"], env["AGENT_CLIENT_KEY"])
    for node in _group_nodes(product):
        base = f"https://{_ip(product, node)}:9443"
        before = _call(prom, "GET", f"{base}/metrics")[1]
        for method, path, body in ROUTES:
            status, text = _call(prom, method, base + path, body)
            if path == "/metrics":
                assert status == 200 and "qos_extender_agent_requests_refused_total" in text, (node, status)
            else:
                assert status == 403 and "may not call" in text, (node, method, path, status, text)
        after = _call(prom, "GET", f"{base}/metrics")[1]
        refused = _metric(after, "qos_extender_agent_requests_refused_total", reason="identity")
        assert (
            refused - _metric(before, "qos_extender_agent_requests_refused_total", reason="identity") == len(ROUTES) - 1
        ), "every refusal is counted"
        # and the controller's identity, which starts migrations, does not read /metrics
        status, text = _call(ctl, "GET", f"{base}/metrics")
        assert status == 403, (status, text)


def test_authz_migrations_to_non_agents_and_of_kube_system_or_pods_not_opted_in_are_refused_before_a_checkpoint(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
) -> None:
    env, kube = product.env, product.kube
    batch, service = _group_nodes(product)
    src = f"https://{_ip(product, batch)}:9443"
    dst_ip = _ip(product, service)
    ctl = _ctx(env["AGENT_CA"], env["AGENT_CLIENT_CERT"], env["AGENT_CLIENT_KEY"])
    prom = _ctx(env["AGENT_CA"], env["AGENT_METRICS_CERT"], env["AGENT_METRICS_KEY"])
    opted = {"qos.kube-qos-extender.io/migratable": "true"}
    kube.create_pod(namespace, _pod("opted", batch, opted))
    kube.create_pod(namespace, _pod("plain", batch, {}))
    system = f"qos-authz-{uuid.uuid4().hex[:6]}"
    kube.create_pod("kube-system", _pod(system, batch, opted))
    try:
        cids = {n: _running(product, ns, n)["status"]["containerStatuses"][0]["containerID"]
                for ns, n in ((namespace, "opted"), (namespace, "plain"), ("kube-system", system))}  # fmt: skip
        api_server = env.get("KUBE_APISERVER_URL") or _apiserver(env["KUBECONFIG"])
        cases = [
            # (workload, destination, reason refused, the refusal's kind)
            ((namespace, "opted"), {"url": f"http://{dst_ip}:9443", "node": service}, "is not https", "destination"),
            ((namespace, "opted"), {"url": api_server, "node": service}, f"is not the agent of node {service}",
             "destination"),
            ((namespace, "opted"), {"url": f"https://{dst_ip}:9443", "node": "not-a-node"},
             "is not the agent of node not-a-node", "destination"),
            ((namespace, "opted"), {"url": f"https://{dst_ip}:9443"}, "destination.node is required", "destination"),
            (("kube-system", system), {"url": f"https://{dst_ip}:9443", "node": service},
             "namespace kube-system is never migrated", "policy"),
            ((namespace, "plain"), {"url": f"https://{dst_ip}:9443", "node": service}, "has not opted in", "policy"),
        ]  # fmt: skip
        checkpoints = _checkpoints(product, batch)
        metrics_before = _call(prom, "GET", f"{src}/metrics")[1]
        for i, ((ns, pod), dest, why, _) in enumerate(cases):
            mid = f"authz-{uuid.uuid4().hex[:8]}-{i}"
            body = {"id": mid, "workload": {"namespace": ns, "pod": pod, "container": "c"}, "destination": dest}
            status, text = _call(ctl, "POST", f"{src}/v1/migrations", body, timeout=60)
            assert status == 403 and why in text, (dest, status, text)
            # nothing journaled: the agent never started it
            assert _call(ctl, "GET", f"{src}/v1/migrations/{mid}")[0] == 404
        metrics_after = _call(prom, "GET", f"{src}/metrics")[1]
        # no checkpoint was taken: none in the kubelet's directory, none timed by the agent
        assert _checkpoints(product, batch) == checkpoints
        count = "qos_extender_checkpoint_seconds_count"
        assert _metric(metrics_after, count) == _metric(metrics_before, count)
        for kind in ("destination", "policy"):
            want = sum(1 for c in cases if c[3] == kind)
            name, route = "qos_extender_agent_requests_refused_total", "/v1/migrations"
            got = _metric(metrics_after, name, reason=kind, route=route)
            assert got - _metric(metrics_before, name, reason=kind, route=route) == want, (kind, metrics_after)
        # nothing lost: the same containers still run
        for ns, n in ((namespace, "opted"), (namespace, "plain"), ("kube-system", system)):
            pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{n}")
            assert pod["status"]["containerStatuses"][0]["containerID"] == cids[n]
            assert "running" in pod["status"]["containerStatuses"][0]["state"]
    finally:
        kube.delete_pod("kube-system", system)


def _apiserver(kubeconfig: str) -> str:
    text = Path(kubeconfig).read_text()
    m = re.search(r"server:\s*(\S+)", text)
    assert m, kubeconfig
    return m.group(1).rstrip("/")


def test_identity_an_agents_credentials_cannot_checkpoint_or_migrate_on_another_node(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    env, kube = product.env, product.kube
    batch, service = _group_nodes(product)
    stolen = _steal(product, batch, tmp_path / "batch-agent")
    # its certificate names its node, and only its node
    subject = subprocess.run(["openssl", "x509", "-in", str(stolen["tls.crt"]), "-noout", "-subject", "-ext",
                              "subjectAltName"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert f"CN=qos-agent:{batch}" in subject.replace(" = ", "=") and _ip(product, batch) in subject
    assert _ip(product, service) not in subject
    # the kubelets' serving CA: the local CA on real nodes, the cluster CA on kind (hack/kind-up.sh prints it)
    kubelet_ca = env.get("QOS_KUBELET_CA") or str(Path(env["QOS_STATE"]) / "certs" / "ca.crt")
    kctx = _ctx(kubelet_ca, str(stolen["kubelet.crt"]), str(stolen["kubelet.key"]))
    kube.create_pod(namespace, _pod("on-batch", batch, {}))
    kube.create_pod(namespace, _pod("on-service", service, {}))
    _running(product, namespace, "on-batch")
    _running(product, namespace, "on-service")
    before = _checkpoints(product, service)
    # the kubelet of the other node asks the API server, which says no to qos-agent:<batch> there
    status, text = _call(kctx, "POST", f"https://{_ip(product, service)}:10250/checkpoint/{namespace}/on-service/c",
                         timeout=60)  # fmt: skip
    assert status == 403 and f"qos-agent:{batch}" in text, (status, text)
    assert _checkpoints(product, service) == before
    # ... while on its own node the same credential works (the refusal above is about the node, not the cert)
    mine = _checkpoints(product, batch)
    status, text = _call(kctx, "POST", f"https://{_ip(product, batch)}:10250/checkpoint/{namespace}/on-batch/c",
                         timeout=120)  # fmt: skip
    assert status == 200, (status, text)
    made = sorted(set(_checkpoints(product, batch)) - set(mine))
    assert made, "the kubelet wrote the checkpoint archive"
    for name in made:
        product.node_rm(batch, f"{product.node_dir(batch, 'kubelet-checkpoints')}/{name}")
    # the stolen mTLS certificate on the other node's agent: no migration, no probe of its health, no metrics
    actx = _ctx(env["AGENT_CA"], str(stolen["tls.crt"]), str(stolen["tls.key"]))
    other = f"https://{_ip(product, service)}:9443"
    body = {"workload": {"namespace": namespace, "pod": "on-service", "container": "c"},
            "destination": {"url": f"https://{_ip(product, batch)}:9443", "node": batch}}  # fmt: skip
    for method, path, payload in (("POST", "/v1/migrations", body), ("GET", "/healthz", None),
                                  ("GET", "/metrics", None), ("PUT", "/v1/test/faults", {"faults": {}})):  # fmt: skip
        status, text = _call(actx, method, other + path, payload)
        assert status == 403, (method, path, status, text)
    assert _checkpoints(product, service) == before
