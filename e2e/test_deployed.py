"""The product as users install it, deployed for real (issues 12, 30), on kind.

A kind cluster from ``hack/kind-up.sh`` (a control plane and kind workers labelled node-group service and batch:
one and two in CI; kind built offline here, the official kindest/node elsewhere), into which hack/kind-up.sh loads
the image built by ``hack/build-image.sh`` and applies config/kind through ``hack/deploy-local.sh`` (config/kind =
config/default + the Components it shares with config/local). The module deploys again (idempotent) and checks
what a platform team would: the qos-scheduler Deployment (kube-scheduler + extender sidecar) runs as real
containers and wins its leases, the apiserver reaches the admission webhook served by a pod, a qos pod is
gated, released, filtered and bound by the in-cluster extender and really runs on a kind worker, Prometheus (in
the cluster) scrapes the in-cluster extender, the agent DaemonSet is Ready on every worker, and the autoscaler
sidecar adds a kwok node (faked by the in-cluster kwok) for a pod no node can hold.

The fixture serves every module marked ``deployed`` (migration, consolidation, co-location, the agents' identity,
leader election) on either topology: ``kind`` (what CI runs: phase 3 of hack/run-live-tests.sh; CRIU is in the
node image) or ``real-nodes`` (hack/local-up.sh real:..., phase 2 on demand: QOS_LIVE_PHASES=2).
Fails, never skips, without such a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from lab.kube_sync import Kube, KubeError, http_json

pytestmark = [pytest.mark.live, pytest.mark.deployed]

ROOT = Path(__file__).resolve().parents[1]
NS = "kube-qos-system"
AGENT_NS = "kube-qos-agent"
GATE = "qos.kube-qos-extender.io/ordering"
MARKER = "qos.kube-qos-extender.io/managed"
PROVISIONED_BY = "qos.kube-qos-extender.io/provisioned-by"
BUSYBOX = "qos-local/busybox:1.35.0"
IMAGES = ("kube-qos-extender.tar", "kube-scheduler.tar")


def _fail(msg: str) -> None:
    pytest.fail(msg, pytrace=False)


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        _fail(f"{' '.join(cmd)}: no answer in {timeout:.0f}s")
    if out.returncode != 0:
        _fail(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return out.stdout


@dataclass
class Product:
    """The deployed product and where it runs: ``real_nodes`` are the nodes whose containerd really runs
    containers -- kind's workers (topology ``kind``, hack/kind-up.sh) or hack/real-nodes.sh's kubelets (topology
    ``real-nodes``, hack/local-up.sh real:...)."""

    kube: Kube
    env: dict[str, str]
    state: Path
    bin_dir: Path
    real_nodes: list[str]
    prometheus_url: str
    topology: str = "real-nodes"
    timings: dict[str, float] = field(default_factory=dict)

    def on_node(self, node: str) -> list[str]:
        """The prefix that runs a command in the node's own namespaces (PIDs from ``ctr`` are the node's)."""
        return ["docker", "exec", node] if self.topology == "kind" else []

    def node_dir(self, node: str, what: str) -> str:
        """Where, as the node sees its files, the kubelet keeps checkpoints (``kubelet-checkpoints``) and the agent
        its journal and archives (``agent``): config/agent's paths on a kind node, per node under
        /var/lib/qos-local-nodes on hack/real-nodes.sh's (config/local's subPathExpr)."""
        if self.topology == "kind":
            return {"kubelet-checkpoints": "/var/lib/kubelet/checkpoints", "agent": "/var/lib/kube-qos-extender/agent"}[
                what
            ]
        return (
            f"/var/lib/qos-local-nodes/{node}/"
            + {"kubelet-checkpoints": "kubelet/checkpoints", "agent": "qos-agent"}[what]
        )

    def node_ls(self, node: str, path: str) -> list[str] | None:
        """The names in a directory of the node (None: no such directory)."""
        if self.topology == "kind":
            out = subprocess.run(["docker", "exec", node, "ls", "-A", path], capture_output=True, text=True, timeout=30)
            return sorted(out.stdout.split()) if out.returncode == 0 else None
        d = Path(path)
        return sorted(q.name for q in d.iterdir()) if d.is_dir() else None

    def machines(self) -> list[str]:
        """The machines behind the nodes, as the machine sees them (not the API): kind's node containers of this
        cluster, or hack/real-nodes.sh's registry."""
        if self.topology == "kind":
            label = f"label=io.x-k8s.kind.cluster={self.env['KIND_CLUSTER']}"
            out = _run(["docker", "ps", "-a", "--filter", label, "--format", "{{.Names}}"], self.env, 30)
        else:
            out = _run([str(ROOT / "hack/real-nodes.sh"), "list"], self.env, 30)
        return sorted(line.split()[0] for line in out.splitlines() if line.strip())

    def remove_machine(self, node: str) -> None:
        """What a cloud does when the autoscaler deletes an instance: the Node object goes and the machine stops
        (kind: its container removed; real nodes: hack/real-nodes.sh remove -- kubelet, containerd, netns, files)."""
        if self.topology == "kind":
            with contextlib.suppress(KubeError):
                self.kube.delete_node(node)
            _run(["docker", "rm", "-f", "-v", node], self.env, 120)
        else:
            _run([str(ROOT / "hack/real-nodes.sh"), "remove", node], self.env, 300)

    def ctr_import(self, node: str, tar: Path) -> None:
        """An image archive of this host into the node's containerd (k8s.io namespace)."""
        if self.topology == "kind":
            with tar.open("rb") as f:
                out = subprocess.run(["docker", "exec", "-i", node, "ctr", "-n", "k8s.io", "images", "import", "-"],
                                     stdin=f, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
        else:
            self.ctr(node, "images", "import", str(tar))

    def restart_containerd(self, node: str, *, restore_via_create: bool) -> None:
        """The node's containerd restarted with containerd's restore of checkpoints through CreateContainer on or
        off (``false`` is what containerd 2.2.7+/2.3.4+ default to and 2.4 no longer has), config checked."""
        want = f"enable_experimental_restore_via_create = {str(restore_via_create).lower()}"
        if self.topology == "kind":
            conf = "/etc/containerd/config.toml"
            sed = f"s#enable_experimental_restore_via_create = .*#{want}#"
            _run(["docker", "exec", node, "sed", "-i", sed, conf], self.env, 30)
            _run(["docker", "exec", node, "systemctl", "restart", "containerd"], self.env, 120)
            toml = _run(["docker", "exec", node, "cat", conf], self.env, 30)
        else:
            env = dict(self.env, QOS_NODE_RESTORE_VIA_CREATE=str(restore_via_create).lower())
            _run([str(ROOT / "hack/real-nodes.sh"), "restart-containerd", node], env, 300)
            toml = Path(f"/var/lib/qos-local-nodes/{node}/containerd.toml").read_text()
        assert want in toml, toml

    def node_rm(self, node: str, path: str) -> None:
        if self.topology == "kind":
            subprocess.run(["docker", "exec", node, "rm", "-f", path], capture_output=True, timeout=30, check=True)
        else:
            Path(path).unlink(missing_ok=True)

    def restart_crio(self, node: str, *, criu_support: bool) -> None:
        """A CRI-O node's crio restarted with checkpoint/restore on or off (``enable_criu_support``), config
        checked (hack/real-nodes.sh's CRI-O nodes only: phase 5)."""
        assert self.topology != "kind", "kind's nodes run containerd"
        want = f"enable_criu_support = {str(criu_support).lower()}"
        env = dict(self.env, QOS_NODE_CRIU_SUPPORT=str(criu_support).lower())
        _run([str(ROOT / "hack/real-nodes.sh"), "restart-runtime", node], env, 300)
        conf = Path(f"/var/lib/qos-local-nodes/{node}/crio.conf").read_text()
        assert want in conf, conf

    def ctr(self, node: str, *args: str) -> str:
        if self.topology == "kind":  # the node is a container: its containerd answers on its own socket
            return _run(["docker", "exec", node, "ctr", "-n", "k8s.io", *args], self.env, 60)
        sock = f"/run/qos-local-nodes/{node}/containerd.sock"
        return _run([str(self.bin_dir / "ctr"), "--address", sock, "-n", "k8s.io", *args], self.env, 60)

    def prom(self, query: str) -> list[dict[str, Any]]:
        doc = http_json(f"{self.prometheus_url}/api/v1/query?query={quote(query)}")
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result


def _ready(obj: dict[str, Any]) -> bool:
    conds = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


@pytest.fixture(scope="module")
def product() -> Iterator[Product]:
    env = dict(os.environ)
    missing = [k for k in ("KUBECONFIG", "QOS_STATE", "QOS_BIN_DIR", "PROMETHEUS_URL") if not env.get(k)]
    if missing:
        _fail(
            f"the deployed e2e needs the product cluster: {', '.join(missing)} not set. Run hack/run-live-tests.sh "
            "(phase 2), or: QOS_WITH_EXTENDER=0 QOS_HOST_QOS_PROFILE=0 QOS_MANIFESTS_DIR=none hack/local-up.sh "
            "real:service:m1.medium=1 real:batch:m1.large=1"
        )
    state = Path(env["QOS_STATE"])
    topology = env.get("QOS_TOPOLOGY", "real-nodes")
    kube = Kube(env["KUBECONFIG"])
    if topology == "kind":
        # kind's workers (hack/kind-up.sh labels them type=kind); the images are in them already (node image,
        # `kind load`), and the product was deployed by hack/kind-up.sh: deploying again below is idempotent
        real = sorted(n["metadata"]["name"] for n in kube.nodes(label_selector="type=kind"))
        if len(real) < 2:
            _fail(f"the deployed e2e needs two kind workers (one per node group); type=kind nodes: {real}")
    else:
        listing = _run([str(ROOT / "hack/real-nodes.sh"), "list"], env, 30)
        real = [line.split()[0] for line in listing.splitlines() if line.strip()]
        if len(real) < 2:
            _fail(f"the deployed e2e needs two real nodes (one per node group); hack/real-nodes.sh list: {listing!r}")
    images = Path(env.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender"))) / "images"
    tars = [images / t for t in IMAGES]
    absent = [str(t) for t in tars if not t.is_file()]
    if absent:
        _fail(f"images not built: {', '.join(absent)} (run hack/build-image.sh)")
    p = Product(kube, env, state, Path(env["QOS_BIN_DIR"]), real, env["PROMETHEUS_URL"].rstrip("/"), topology)
    if topology != "kind":
        t0 = time.monotonic()
        _run([str(ROOT / "hack/real-nodes.sh"), "import", *map(str, tars)], env, 600)
        p.timings["image_import_seconds"] = time.monotonic() - t0
    t0 = time.monotonic()
    out = _run([str(ROOT / "hack/deploy-local.sh")], env, 900)
    p.timings["deploy_rollout_seconds"] = time.monotonic() - t0
    p.env.update(line.split("=", 1) for line in out.splitlines() if "=" in line)  # type: ignore[misc]
    try:
        yield p
    finally:
        (state / "deployed-timings.json").write_text(json.dumps(p.timings, indent=1, sort_keys=True))
        for n in kube.nodes(label_selector=PROVISIONED_BY):
            with contextlib.suppress(KubeError):
                kube.delete_node(n["metadata"]["name"])
        kube.close()


@pytest.fixture
def namespace(product: Product) -> Iterator[str]:
    ns = f"qos-deployed-{uuid.uuid4().hex[:6]}"
    product.kube.ensure_namespace(ns)
    try:
        yield ns
    finally:
        product.kube.delete_namespace(ns)


def test_images_are_in_every_real_node(product: Product) -> None:
    for node in product.real_nodes:
        refs = product.ctr(node, "images", "ls", "-q").split()
        assert "docker.io/library/kube-qos-extender:dev" in refs, (node, refs)
        assert "registry.k8s.io/kube-scheduler:v1.35.8" in refs, (node, refs)


def test_qos_scheduler_runs_as_real_containers_and_wins_its_leases(product: Product) -> None:
    pods = product.kube.pods(NS, label_selector="app.kubernetes.io/name=qos-scheduler")
    running = [p for p in pods if p["status"].get("phase") == "Running" and _ready(p)]
    assert running, [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
    names = {p["metadata"]["name"] for p in running}
    for pod in running:
        node = pod["spec"]["nodeName"]
        assert node in product.real_nodes, f"{pod['metadata']['name']} on {node}, not a real node"
        # the extender is a native sidecar (an init container with restartPolicy Always): its status is among
        # the init containers'
        statuses = {
            c["name"]: c
            for c in pod["status"].get("containerStatuses", []) + pod["status"].get("initContainerStatuses", [])
        }
        assert set(statuses) == {"kube-scheduler", "extender"}, statuses.keys()
        tasks = product.ctr(node, "tasks", "ls")
        for c in statuses.values():
            assert c["ready"] and "running" in c["state"], c
            cid = c["containerID"].removeprefix("containerd://")
            line = next((t for t in tasks.splitlines() if t.startswith(cid)), "")
            assert "RUNNING" in line, f"container {c['name']} ({cid}) is not a running task on {node}:\n{tasks}"
    # kube-scheduler's identity is <hostname>_<uuid>; the hostname of a pod is its name
    lease = product.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/qos-scheduler")
    holder = lease["spec"].get("holderIdentity", "")
    assert holder.split("_")[0] in names, (holder, names)
    # the QoS controller's own Lease (identity $POD_NAME)
    leases = product.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases")["items"]
    controller = [lease for lease in leases if lease["metadata"]["name"].startswith("kube-qos-extender-")]
    assert controller, [lease["metadata"]["name"] for lease in leases]
    assert controller[0]["spec"].get("holderIdentity") in names, controller[0]["spec"]


def test_pods_on_different_real_nodes_reach_each_other_and_services(product: Product, namespace: str) -> None:
    """The pod network: a pod on one real node fetches a page from a pod on the other, by pod IP and through a
    Service's ClusterIP (kube-proxy in the nodes' namespaces)."""
    kube = product.kube
    server_node, client_node = product.real_nodes[0], product.real_nodes[1]

    def plain(name: str, node: str, command: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sh", "-c", command]}
                ],
            },
        }

    token = uuid.uuid4().hex
    kube.create_pod(
        namespace,
        plain("web", server_node, f"mkdir -p /www && echo {token} > /www/index.html && httpd -f -p 8080 -h /www",
              {"app": "web"}),
    )  # fmt: skip
    kube.create(
        f"/api/v1/namespaces/{namespace}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    kube.create_pod(namespace, plain("client", client_node, "sleep 3600", {}))

    def ip_of(name: str) -> str | None:
        pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod["status"].get("podIP") if pod["status"].get("phase") == "Running" else None

    web_ip = kube.wait(lambda: ip_of("web"), "web pod Running", timeout=60)
    kube.wait(lambda: ip_of("client"), "client pod Running", timeout=60)
    cluster_ip = kube.get(f"/api/v1/namespaces/{namespace}/services/web")["spec"]["clusterIP"]
    kubectl = [str(product.bin_dir / "kubectl"), "exec", "-n", namespace, "client", "--"]
    # (busybox's nc, not its wget: Debian's static busybox wget segfaults, static glibc without NSS)
    for host, port in ((web_ip, 8080), (cluster_ip, 80)):
        url = f"http://{host}:{port}/"

        def fetched(host: str = host, port: int = port) -> bool:
            request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} {port}"
            try:  # (a stuck exec stream must not hang the suite: kube.wait cannot interrupt it)
                out = subprocess.run(
                    [*kubectl, "sh", "-c", request], env=product.env, capture_output=True, text=True, timeout=20
                )
            except subprocess.TimeoutExpired:
                return False
            return token in out.stdout

        kube.wait(fetched, f"client on {client_node} fetching {url} from {server_node}", timeout=60, interval=1.0)


def _qos_pod(name: str, *, kind: str, cpu: str, memory: str, image: str = BUSYBOX) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"qos.kube-qos-extender.io/class": "gold", "qos.kube-qos-extender.io/kind": kind},
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "c",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"],
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


def _cores(quantity: str) -> int:
    return -(-int(quantity[:-1]) // 1000) if quantity.endswith("m") else int(quantity)


def _requests(product: Product, verb: str) -> float:
    rows = product.prom(
        f'sum(qos_extender_requests_total{{job="kube-qos-extender-in-cluster",verb="{verb}",outcome="ok"}})'
    )
    return float(rows[0]["value"][1]) if rows else 0.0


def test_qos_pod_is_gated_released_filtered_bound_and_runs(product: Product, namespace: str) -> None:
    kube = product.kube
    # the counters are read before the pod exists: the target must already be scraped, or "before" is 0 and
    # any later sample would pass
    product.kube.wait(
        lambda: product.prom('up{job="kube-qos-extender-in-cluster"} == 1'), "the extender pod scraped", 60, 1.0
    )
    before = {v: _requests(product, v) for v in ("filter", "bind")}
    t0 = time.monotonic()
    created = kube.create_pod(namespace, _qos_pod("svc", kind="service", cpu="100m", memory="32Mi"))
    # The apiserver called the admission webhook served by the extender pod (the only webhook in this cluster:
    # hack/manifests was not applied): the object it stored is gated, and carries no routing marker: the
    # deployed kube-scheduler serves qos-scheduler only (a marker would block cluster-autoscaler's simulation).
    gates = [g["name"] for g in created["spec"].get("schedulingGates") or []]
    assert GATE in gates, created["spec"]
    assert MARKER not in created["spec"]["containers"][0]["resources"]["requests"], created["spec"]["containers"][0]
    path = f"/api/v1/namespaces/{namespace}/pods/svc"

    def running() -> dict[str, Any] | None:
        pod = kube.get(path)
        return pod if pod["status"].get("phase") == "Running" and _ready(pod) else None

    pod = kube.wait(running, "the qos pod Running", timeout=120)
    product.timings["qos_pod_create_to_running_seconds"] = time.monotonic() - t0
    node = pod["spec"]["nodeName"]
    assert node in product.real_nodes, node
    assert kube.get(f"/api/v1/nodes/{node}")["metadata"]["labels"]["qos.kube-qos-extender.io/node-group"] == "service"
    reasons = {e.get("reason") for e in kube.events(namespace)}
    assert "QoSReleased" in reasons, reasons
    # it really runs: the kubelet serves its log (apiserver -> kubelet on the node's address)
    logs = _run([str(product.bin_dir / "kubectl"), "logs", "-n", namespace, "svc"], product.env, 60)
    assert "tick" in logs, logs
    # the in-cluster extender filtered and bound it, as Prometheus saw by scraping the extender pod
    kube.wait(
        lambda: all(_requests(product, v) > before[v] for v in ("filter", "bind")),
        "Prometheus to see the in-cluster extender's filter and bind",
        timeout=60,
        interval=1.0,
    )


def test_prometheus_scrapes_the_in_cluster_extender(product: Product) -> None:
    def up() -> list[dict[str, Any]] | None:
        rows = product.prom('up{job="kube-qos-extender-in-cluster"} == 1')
        return rows or None

    rows = product.kube.wait(up, "Prometheus target kube-qos-extender-in-cluster up", timeout=60, interval=1.0)
    # every target is the extender of a running qos-scheduler pod on a node of the product (by pod IP; where the
    # discovery labels targets with their node, by that too)
    pods = product.kube.pods(NS, label_selector="app.kubernetes.io/name=qos-scheduler")
    ips = {p["status"].get("podIP"): p["spec"].get("nodeName") for p in pods if p["status"].get("phase") == "Running"}
    for r in rows:
        ip = r["metric"]["instance"].rsplit(":", 1)[0]
        assert ip in ips and ips[ip] in product.real_nodes, (r["metric"], ips)
        assert r["metric"].get("node", ips[ip]) == ips[ip], (r["metric"], ips)
    assert product.prom('qos_extender_snapshot_nodes{job="kube-qos-extender-in-cluster"}') or product.prom(
        '{job="kube-qos-extender-in-cluster",__name__=~"qos_extender_.+"}'
    )


def test_agent_daemonset_is_ready_on_every_real_node(product: Product) -> None:
    # A real node an earlier module removed (test_consolidation_real) still counts in the DaemonSet's status until
    # PodGC deletes its orphaned agent pod (40 s after the Node went: the DaemonSet controller has no Node-delete
    # handler), so the status is waited for, never read once; it must come to exactly the real nodes.
    def settled() -> dict[str, Any] | None:
        st: dict[str, Any] = product.kube.get(f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/qos-agent")["status"]
        ok = st.get("numberReady") == st.get("desiredNumberScheduled") == len(product.real_nodes)
        return st if ok else None

    try:
        product.kube.wait(settled, "the agent DaemonSet Ready on exactly the real nodes", timeout=120, interval=1)
    except TimeoutError:
        ds = product.kube.get(f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/qos-agent")
        raise AssertionError((ds["status"], product.real_nodes)) from None
    pods = product.kube.pods(AGENT_NS)
    on = {p["spec"].get("nodeName") for p in pods if _ready(p)}
    assert set(product.real_nodes) <= on, (product.real_nodes, on)


def test_autoscaler_sidecar_adds_a_kwok_node_for_a_pod_no_node_holds(product: Product, namespace: str) -> None:
    kube = product.kube
    assert not kube.nodes(label_selector=PROVISIONED_BY)
    # more cpu than any real node has (they report this machine's cores): only a bought node can hold it
    cores = max(_cores(kube.get(f"/api/v1/nodes/{n}")["status"]["allocatable"]["cpu"]) for n in product.real_nodes)
    largest = max(int(f["cpu"]) for f in yaml.safe_load((ROOT / "config/flavours.yaml").read_text())["flavours"])
    assert cores + 1 <= largest, f"this machine's {cores} cores leave no flavour larger than a real node"
    t0 = time.monotonic()
    kube.create_pod(namespace, _qos_pod("big", kind="batch", cpu=str(cores + 1), memory="1Gi"))
    path = f"/api/v1/namespaces/{namespace}/pods/big"

    def bound() -> str | None:
        node = kube.get(path)["spec"].get("nodeName")
        return node if isinstance(node, str) else None

    node = kube.wait(bound, "the big pod bound to a node the autoscaler bought", timeout=240, interval=1.0)
    product.timings["scale_up_create_to_bound_seconds"] = time.monotonic() - t0
    labels = kube.get(f"/api/v1/nodes/{node}")["metadata"]["labels"]
    assert labels.get(PROVISIONED_BY) and labels.get("type") == "kwok", labels
    reasons = {e.get("reason") for e in kube.events(namespace)}
    assert "TriggeredScaleUp" in reasons, reasons
