"""A counting pod migrates between two real kubelet nodes with its count intact (issue 13, deliverable 1).

The cluster and the deployed product are e2e/test_deployed.py's (``product`` fixture: the image imported into the
real nodes, config/local applied by hack/deploy-local.sh, the agent DaemonSet Ready on both real nodes). Here:

1. a busybox counter pod (``qos-local/busybox:1.35.0``, ``imagePullPolicy: Never``, kind batch) runs on the batch
   real node and prints ``tick N`` every second;
2. the consolidation flow (``ConsolidationFlow.move_pod``, run in this process against the cluster, as the
   autoscaler runs it: with a token of its ServiceAccount and the consolidation role, ``autoscaler_kubeconfig``)
   asks the batch node's agent to migrate it to the service node: kubelet checkpoint on the
   source (the agent's client certificate, ``nodes/checkpoint`` only), sha256-verified transfer to the other
   agent, checkpoint image imported into that node's containerd (Transfer API, no registry); the flow creates
   the destination pod from that image, pinned to the node, waits for its container to run, deletes the source;
3. checked: the destination's first tick is the one after the last tick the source printed before the final
   checkpoint (no reset, no gap), its ticks go on one by one, exactly one copy runs (the API, and each node's
   containerd), the archives are gone on both agents and in the kubelet's checkpoint directory.

Runs with ``-m deployed`` on the cluster of ``hack/local-up.sh real:service:m1.medium=1 real:batch:m1.large=1``
(see e2e/test_deployed.py); fails, never skips, without it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.test_deployed import BUSYBOX, Product, _ready, _run, namespace, product  # noqa: F401  (fixtures)
from e2e.ticks import LogFollower, logged_ticks
from extender.consolidation import policy
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.policy import MoveVerdict
from extender.consolidation.settings import AgentEndpoint, ConsolidationSettings
from extender.core.migration import agent_identity
from extender.kube.client import new_api_client
from extender.settings.extender import ExtenderConfig, KubernetesConfig

pytestmark = [pytest.mark.live, pytest.mark.deployed]

GROUP = "qos.kube-qos-extender.io/node-group"


def _group_nodes(p: Product) -> tuple[str, str]:
    groups = {n: p.kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(GROUP) for n in p.real_nodes}
    batch = [n for n, g in groups.items() if g == "batch"]
    service = [n for n, g in groups.items() if g == "service"]
    assert batch and service, groups
    return batch[0], service[0]


def _counter(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            # opted in to migration (the agents refuse other pods, extender/core/migration.py): it bypasses the
            # qos-scheduler, whose pods are opted in by their schedulerName
            "annotations": {
                "qos.kube-qos-extender.io/class": "gold",
                "qos.kube-qos-extender.io/kind": "batch",
                "qos.kube-qos-extender.io/migratable": "true",
            },
        },
        "spec": {
            "nodeName": node,  # placed on the batch node directly: this test is about the move, not the scheduler
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"],
                    "resources": {"requests": {"cpu": "50m", "memory": "16Mi"}},
                }
            ],
        },
    }


def _logs(p: Product, ns: str, pod: str) -> list[tuple[float, int]]:
    return logged_ticks(p.bin_dir, p.env, ns, pod)


def _history(record: dict[str, Any], phase: str) -> float:
    stamps = [t for p, t in record.get("history", []) if p == phase]
    assert stamps, (phase, record.get("history"))
    return float(stamps[-1])


AUTOSCALER_SA = ("kube-qos-system", "qos-autoscaler")
CONSOLIDATION_RBAC = Path(__file__).resolve().parents[1] / "config/autoscaler/consolidation/rbac.yaml"


def autoscaler_kubeconfig(p: Product, out: Path) -> Path:
    """A kubeconfig holding a token of the autoscaler's ServiceAccount, with the consolidation component's role
    applied as it ships (config/autoscaler/consolidation/rbac.yaml). The flow runs as the autoscaler runs it in a
    cluster: with that identity and nothing more, so a call the role does not grant -- or an admission rule it does
    not satisfy, e.g. blockOwnerDeletion under OwnerReferencesPermissionEnforcement (on in the kind cluster) --
    fails the move here, where an admin kubeconfig would pass it."""
    _run([str(p.bin_dir / "kubectl"), "apply", "-f", str(CONSOLIDATION_RBAC)], p.env, 60)
    ns, name = AUTOSCALER_SA
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}
    token = p.kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", review)["status"]["token"]
    admin = yaml.safe_load(Path(p.env["KUBECONFIG"]).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    out.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
                "current-context": name,
            }
        )
    )
    out.chmod(0o600)
    return out


@pytest.fixture
def flow(product: Product, tmp_path: Path) -> Iterator[ConsolidationFlow]:  # noqa: F811
    env = product.env
    missing = [k for k in ("AGENT_CA", "AGENT_CLIENT_CERT", "AGENT_CLIENT_KEY") if not env.get(k)]
    assert not missing, f"hack/deploy-local.sh did not print {missing}"
    settings = ConsolidationSettings(
        enabled=True,
        agent=AgentEndpoint(
            cert_file=env["AGENT_CLIENT_CERT"], key_file=env["AGENT_CLIENT_KEY"], ca_file=env["AGENT_CA"]
        ),
        migration_timeout_seconds=180,
        destination_ready_timeout_seconds=90,
    )
    f = ConsolidationFlow(settings)
    loop = asyncio.new_event_loop()
    kubeconfig = autoscaler_kubeconfig(product, tmp_path / "qos-autoscaler.kubeconfig")
    api = loop.run_until_complete(new_api_client(KubernetesConfig(kubeconfig=str(kubeconfig))))
    f.attach(api, ExtenderConfig().bind)
    f.loop = loop  # type: ignore[attr-defined]
    try:
        yield f
    finally:
        loop.run_until_complete(f.stop())
        loop.run_until_complete(api.close())
        loop.close()


def _pods(p: Product, ns: str) -> list[dict[str, Any]]:
    return p.kube.pods(ns)


def _running_tasks(p: Product, node: str) -> list[str]:
    return [line.split()[0] for line in p.ctr(node, "tasks", "ls").splitlines()[1:] if "RUNNING" in line]


def _cid(pod: dict[str, Any]) -> str:
    return str(pod["status"]["containerStatuses"][0]["containerID"]).removeprefix("containerd://")


def agent_features(product: Product, flow: ConsolidationFlow, node: str) -> dict[str, Any]:  # noqa: F811
    """The node's agent's ``GET /v1/info`` features (its runtime, and its answer to "can you restore?"), asked
    with the flow's own client and identity pin, as the flow asks before any checkpoint."""
    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
    url = policy.agent_url(product.kube.get(f"/api/v1/nodes/{node}"), port=9443)
    assert url is not None and flow._client is not None
    flow._client.pin(url, agent_identity(node))
    info = loop.run_until_complete(flow._client.request("GET", f"{url}/v1/info"))
    features: dict[str, Any] = info["features"]
    return features


def _assert_source_kept(prod: Product, ns: str, src_cid: str, batch: str) -> None:
    """After a refused move: exactly one copy, the source pod, still the same container, still counting (it
    never restarted); the destination pod is gone."""
    kube = prod.kube
    path = f"/api/v1/namespaces/{ns}/pods/counter"
    kube.wait(lambda: [p["metadata"]["name"] for p in _pods(prod, ns)] == ["counter"] or None,
              "only the source pod left", timeout=60, interval=0.5)  # fmt: skip
    assert _cid(kube.get(path)) == src_cid and src_cid in _running_tasks(prod, batch)
    before = _logs(prod, ns, "counter")[-1][1]
    kube.wait(lambda: _logs(prod, ns, "counter")[-1][1] >= before + 2 or None, "the source counting on",
              timeout=30, interval=0.5)  # fmt: skip
    ticks = [n for _, n in _logs(prod, ns, "counter")]
    assert ticks == list(range(len(ticks))), "the source never restarted"


def test_counter_pod_migrates_between_real_nodes_with_its_count(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,
) -> None:
    kube = product.kube
    batch, service = _group_nodes(product)
    kube.create_pod(namespace, _counter("counter", batch))
    path = f"/api/v1/namespaces/{namespace}/pods/counter"
    src = kube.wait(lambda: pod if _ready(pod := kube.get(path)) else None, "the counter Running", timeout=120)
    assert src["spec"]["nodeName"] == batch
    src_cid = _cid(src)
    follower = LogFollower(product.bin_dir, product.env, namespace, "counter")
    kube.wait(lambda: len(follower.ticks) >= 8 or None, "8 ticks from the source", timeout=60, interval=0.5)

    t0 = time.monotonic()
    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
    mid = f"counter-move-{uuid.uuid4().hex[:8]}"  # agents keep outcomes by id (idempotent): one per run
    result = loop.run_until_complete(flow.move_pod(mid, kube.get(path), batch, service))
    seconds = time.monotonic() - t0
    record = result.get("record") or {}
    assert result["verdict"] is MoveVerdict.COMMIT, json.dumps(
        {k: v for k, v in result.items() if k != "verdict"}, indent=1, default=str
    )
    follower.proc.wait(30)  # the source pod is deleted: its log stream ends
    follower.stop()
    dest_ns, dest_name = result["destination_pod"].split("/")
    dest = kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}")
    assert dest["spec"]["nodeName"] == service
    image = dest["spec"]["containers"][0]["image"]
    assert image == record["restored_workload"]["image"] and image.startswith("localhost/qos-checkpoint/")
    assert dest["spec"]["containers"][0]["imagePullPolicy"] == "Never"

    # the count goes on from the final checkpoint: the first tick at the destination is the one after the last
    # tick the source printed before the final checkpoint (taken between CUTOVER and FINAL_DUMPED)
    cut, dumped = _history(record, "cutover"), _history(record, "final-dumped")
    before_cut = [n for t, n in follower.ticks if t <= cut]
    by_dump = [n for t, n in follower.ticks if t <= dumped + 0.05]
    assert before_cut, (follower.ticks, cut)

    # containerd restores the container's log with it: the destination's log is the source's (copied when the
    # archive was written, a little after the memory dump, so it may hold a tick or two more) followed by what
    # the restored process printed on the destination, which cannot be before the agents committed
    committed = _history(record, "committed")

    def restored_log() -> list[tuple[float, int]] | None:
        ts = _logs(product, dest_ns, dest_name)
        return ts if sum(1 for t, _ in ts if t > committed) >= 3 else None

    dest_log = kube.wait(restored_log, "3 ticks from the destination", timeout=30, interval=0.5)
    carried = [n for t, n in dest_log if t <= committed]
    after = [(t, n) for t, n in dest_log if t > committed]
    first = after[0][1]
    assert before_cut[-1] + 1 <= first <= by_dump[-1] + 1, (
        f"destination starts at tick {first}; the source had printed {before_cut[-1]} at the cutover and "
        f"{by_dump[-1]} when the final checkpoint ended (source ticks {follower.ticks[-15:]})"
    )
    restored = [n for _, n in after]
    assert restored == list(range(first, first + len(restored))), f"no gap, no repeat after the restore: {restored}"
    assert carried == list(range(len(carried))) and carried[-1] + 1 >= first, f"carried log {carried}"
    assert first >= 8, "no reset"

    # exactly one copy: one pod in the namespace, Running on the service node; the source's container is gone
    # from the batch node's containerd, the destination's container is a running task on the service node
    kube.wait(lambda: [p["metadata"]["name"] for p in _pods(product, namespace)] == [dest_name] or None,
              "only the destination pod left", timeout=60, interval=0.5)  # fmt: skip
    assert _ready(kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}"))
    kube.wait(lambda: src_cid not in _running_tasks(product, batch) or None, "the source task gone", timeout=60)
    assert _cid(kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}")) in _running_tasks(product, service)

    # archives cleaned up: both agents' archive directories for this migration, the kubelet's checkpoints
    for node, role in ((batch, "source"), (service, "destination")):
        left = f"{product.node_dir(node, 'agent')}/archives/{role}/{mid}"
        assert product.node_ls(node, left) is None, f"{left} left behind on {node}: {product.node_ls(node, left)}"
    checkpoints = product.node_ls(batch, product.node_dir(batch, "kubelet-checkpoints")) or []
    leftovers = [n for n in checkpoints if n.startswith("checkpoint-") and n.endswith(".tar")]
    assert not leftovers, leftovers
    # one checkpoint per move (a kubelet checkpoint is whole: no pre-copy); its image stays in the destination's
    # containerd while the pod exists (a container restart restores from it)
    assert record["archives"].keys() == {"final"}, record["archives"]
    assert result.get("checkpoint_image") == "kept for the destination pod's container restarts", result
    assert image in product.ctr(service, "images", "ls", "-q").split()
    n = _logs(product, dest_ns, dest_name)[-1][1]
    kube.wait(lambda: _logs(product, dest_ns, dest_name)[-1][1] >= n + 2 or None, "counting on at the destination",
              timeout=30, interval=0.5)  # fmt: skip

    # stop time: the last tick the restored state had printed (at the source) to the first tick after restore
    last_kept = next(t for t, n in follower.ticks if n == first - 1)
    timings = {
        "migration_seconds": round(seconds, 3),
        "agent_total_seconds": record["timings"].get("total"),
        "checkpoint_precopy_seconds": record["timings"].get("checkpoint_precopy"),
        "checkpoint_final_seconds": record["timings"].get("checkpoint_final"),
        "transfer_final_seconds": record["timings"].get("transfer_final"),
        "restore_import_seconds": record["timings"].get("restore_at_destination"),
        "stop_seconds": round(after[0][0] - last_kept, 3),
        "archive_bytes": int(record["meta"]["archive_bytes"]),
        "bytes_moved": record.get("bytes"),
        "first_destination_tick": first,
        "last_source_tick_before_checkpoint": before_cut[-1],
    }
    product.timings.update({f"migration_{k}": v for k, v in timings.items() if isinstance(v, int | float)})
    print("\nmigration:", json.dumps(timings))


def test_destination_runtime_refuses_the_restore_and_the_source_keeps_running(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,
) -> None:
    """A real refusal by the destination's runtime: the counter's image (hack/build-image.sh's python base, which
    the nodes do not hold) is imported into the batch node only, under ``localhost:1/...`` alone (a registry that
    refuses connections: a pull attempt never leaves the node), so containerd on the service node does not have
    the checkpoint's rootfs image and fails the restore (containerd 2.3.7: "failed to pull checkpoint base image
    sha256:<image id>": the checkpoint names its base by image ID, so a busybox merely retagged on one node is
    found under its other name and restores fine). The flow rolls back: the destination pod is deleted,
    the checkpoint image discarded, the source keeps counting, exactly one copy runs."""
    kube = product.kube
    batch, service = _group_nodes(product)
    only_here = "localhost:1/qos-local/only-on-batch:1"
    tar = Path(product.env.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender"))) / "images/python.tar"
    assert tar.is_file(), f"{tar} missing: run hack/build-image.sh"
    product.ctr_import(batch, tar)
    product.ctr(batch, "images", "tag", "--force", "docker.io/qos-local/python:3.11-bookworm", only_here)
    product.ctr(batch, "images", "rm", "docker.io/qos-local/python:3.11-bookworm")
    assert only_here not in product.ctr(service, "images", "ls", "-q").split()
    pod = _counter("counter", batch)
    pod["spec"]["containers"][0]["image"] = only_here
    kube.create_pod(namespace, pod)
    path = f"/api/v1/namespaces/{namespace}/pods/counter"
    src = kube.wait(lambda: pod if _ready(pod := kube.get(path)) else None, "the counter Running", timeout=120)
    src_cid = _cid(src)
    kube.wait(lambda: len(_logs(product, namespace, "counter")) >= 3 or None, "3 ticks", timeout=60, interval=0.5)

    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
    mid = f"counter-refused-{uuid.uuid4().hex[:8]}"
    result = loop.run_until_complete(flow.move_pod(mid, kube.get(path), batch, service))
    assert result["verdict"] is MoveVerdict.ROLL_BACK and result["outcome"] == "rolled_back", result
    assert "CreateContainerError" in result["reason"] or "restor" in result["reason"], result["reason"]
    # exactly one copy: the source pod, still the same container, still counting; the destination pod is gone
    _assert_source_kept(product, namespace, src_cid, batch)
    for node, role in ((batch, "source"), (service, "destination")):
        left = f"{product.node_dir(node, 'agent')}/archives/{role}/{mid}"
        assert product.node_ls(node, left) is None, (node, left)
    # the checkpoint image nobody runs was discarded by the destination agent
    image = ((result.get("record") or {}).get("restored_workload") or {}).get("image")
    assert image and "checkpoint image discarded" in result["reason"], result["reason"]
    assert image not in product.ctr(service, "images", "ls", "-q").split()


def test_faults_on_real_pods_end_with_one_copy_and_no_lost_progress(product: Product) -> None:  # noqa: F811
    """A representative, fast subset of bench/migration_faults.py's faults (the bench runs all five, >= 20 times),
    through the same code: the agents' TEST-ONLY fault hooks turned on for this cluster (the DaemonSet's
    ``--enable-test-fault-injection``, removed again at the end), a counter moved by the flow while:

    * one byte of the uploaded archive is flipped once: the destination rejects it (sha256), the source sends it
      again, the move succeeds and the count goes on from the checkpoint;
    * the source agent dies once the checkpoint is on its disk: the kubelet restarts it, it rolls the migration
      back from its journal, the flow (repeating its request with the same id) learns that; the source counts on;
    * the destination Node is deleted while its pod is restored from the checkpoint: the flow does not commit
      (the pod GC would delete that pod), deletes it, discards the image; the source counts on; the node's
      kubelet is restarted and registers again.

    Each must end with exactly one running copy (API and both nodes' containerd) and no lost progress."""
    from bench.migration_faults import Bench, Cluster, set_fault_flag

    batch, service = _group_nodes(product)
    c = Cluster(product.env, product.kube, product.bin_dir, batch, service, topology=product.topology)
    set_fault_flag(c, True)
    bench = Bench(c)
    try:
        corrupted = bench.one("archive-corrupted", 1, batch, service)  # odd index: corrupted once
        killed = bench.one("source-killed-after-checkpoint", 0, batch, service)
        deleted = bench.one("dest-node-deleted", 0, service, batch)
    finally:
        bench.close()
        set_fault_flag(c, False)
    for run in (corrupted, killed, deleted):
        assert run.get("one_copy") and run.get("progress_kept"), json.dumps(run, indent=1, default=str)
    assert corrupted["outcome"] == "succeeded" and corrupted["survivor"] == "destination", corrupted
    assert "transfer-final x2" in corrupted["reason"], corrupted["reason"]
    assert killed["outcome"] == "rolled_back" and killed["survivor"] == "source", killed
    assert "restarted" in killed["reason"], killed["reason"]
    assert deleted["node_deleted"] and deleted["outcome"] == "rolled_back" and deleted["survivor"] == "source"
    assert "is gone" in deleted["reason"] or "binding" in deleted["reason"], deleted["reason"]
    assert _ready(product.kube.get(f"/api/v1/nodes/{batch}")), "the deleted node registered again"


def test_a_runtime_without_restore_refuses_cleanly_and_nothing_is_evicted(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,
) -> None:
    """The destination's containerd restarted with ``enable_experimental_restore_via_create = false`` (what 2.2.7+
    and 2.3.4+ default to, and what 2.4 no longer has): it cannot restore a checkpoint image. The destination
    agent says so when asked before any checkpoint (``restore`` in its ``GET /v1/info``, from containerd's version
    and CRI config: issue 32 part 3), so the move is refused with that reason: nothing checkpointed, no
    destination pod, the source never stopped and still counting, one copy. Before the restart, the same agent
    answers that it can restore (containerd 2.3.7 with the option on)."""
    kube = product.kube
    batch, service = _group_nodes(product)
    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]

    def restore_answer() -> dict[str, Any]:
        answer: dict[str, Any] = agent_features(product, flow, service)["restore"]
        return answer

    on = restore_answer()
    assert on["supported"] is True and "enable_experimental_restore_via_create" in on["reason"], on
    assert on["runtime"].startswith("containerd "), on

    def restart_containerd(restore: str) -> None:
        product.restart_containerd(service, restore_via_create=restore == "true")
        kube.wait(lambda: _ready(kube.get(f"/api/v1/nodes/{service}")) or None, "node Ready", timeout=120)

    restart_containerd("false")
    try:
        # the agent asks containerd again at most every 10 s
        off = kube.wait(lambda: a if (a := restore_answer())["supported"] is False else None,
                        "the destination agent saying it cannot restore", timeout=60, interval=1.0)  # fmt: skip
        assert "enable_experimental_restore_via_create off" in off["reason"], off
        kube.create_pod(namespace, _counter("counter", batch))
        path = f"/api/v1/namespaces/{namespace}/pods/counter"
        src = kube.wait(lambda: pod if _ready(pod := kube.get(path)) else None, "the counter Running", timeout=120)
        src_cid = _cid(src)
        kube.wait(lambda: len(_logs(product, namespace, "counter")) >= 3 or None, "3 ticks", timeout=60, interval=0.5)
        mid = f"counter-norestore-{uuid.uuid4().hex[:8]}"
        result = loop.run_until_complete(flow.move_pod(mid, kube.get(path), batch, service))
        print("\nno-restore runtime:", result["outcome"], result["reason"][:400])
        assert result["verdict"] is MoveVerdict.ROLL_BACK and result["outcome"] == "refused", result
        assert f"{service} cannot restore a checkpoint" in result["reason"], result["reason"]
        assert result["record"] is None, "the source agent was never asked: nothing checkpointed"
        _assert_source_kept(product, namespace, src_cid, batch)
        checkpoints = product.node_ls(batch, product.node_dir(batch, "kubelet-checkpoints")) or []
        assert not [n for n in checkpoints if n.startswith("checkpoint-")], checkpoints
    finally:
        restart_containerd("true")
