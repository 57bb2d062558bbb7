"""cluster-autoscaler's calls against `qos-extender autoscaler` serving the externalgrpc cloud provider, on the real
control plane (hack/local-up.sh): a full scale-up / scale-down cycle.

cluster-autoscaler cannot be built here, so ``extender.autoscaler.ca_replay`` makes its 1.35 calls in its order
(Refresh, NodeGroups, NodeGroupForNode per node, TemplateNodeInfo, TargetSize + NodeGroupNodes per group, GetOptions,
pricing, Expander.BestOptions, IncreaseSize; later NodeGroupForNode, GetOptions, TargetSize, DeleteNodes; Cleanup)
over mTLS, with pods and nodes listed from the real API server. The sidecar's nodes come from its kwok provider --
the local STAND-IN FOR A CLOUD API -- and kwok makes them Ready; the real kube-scheduler places the pods on them.

Checked: pods are Unschedulable; the grpc expander (ours) picks the group our planner buys first; IncreaseSize
moves the target size at once and the instance is "creating" with the id ``kwok://<node>``; loops while it boots
buy nothing more (the ledger); the dry-run planning loop counts the booting node and plans nothing either; the Node
appears Ready with that providerID, NodeGroupForNode maps it to its group, the instance is "running", the pods run;
after the pods go, DeleteNodes removes the Node and the target size drops. Needs KUBECONFIG (fails, never skips).
    set -a; eval "$(QOS_STATE=/tmp/qos-egrpc ... hack/local-up.sh)"; set +a
    pytest -m live e2e/test_autoscaler_externalgrpc.py
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from kubernetes_asyncio import client as k8s

from e2e.kwok_autoscaling import autoscaled_namespace, burst_pod
from e2e.kwok_autoscaling import until as _until
from extender.autoscaler.ca_replay import CloudConfig, CloudProviderClient, ReplayedAutoscaler
from extender.autoscaler.config import AutoscalerSettings, CaExpanderSettings, CloudProviderSettings, LagDistribution
from extender.autoscaler.loop import PROVISIONED_BY_LABEL
from extender.autoscaler.main import RunningAutoscaler, start_autoscaler
from extender.autoscaler.protogen import load_expander
from extender.config import ExtenderConfig, KubernetesConfig
from extender.core import autoscale
from extender.core.model import Flavour, NodeGroup, Pod, Resources
from extender.kube.client import read_json
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

GI = 2**30
MI = 2**20
FLAVOURS = (
    Flavour("e2e.std", Resources(2000, 4 * GI, 110), 0.10),
    Flavour("e2e.cpu", Resources(4000, 4 * GI, 110), 0.16),
    Flavour("e2e.mem", Resources(1000, 8 * GI, 110), 0.12),
)
CREATING, RUNNING = 2, 1


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _pki(d: Path) -> dict[str, Path]:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.crt", "-days", "1", "-subj", "/CN=e2e-ca")
    for leaf, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        _openssl("req", *ec, "-keyout", d / f"{leaf}.key", "-out", d / f"{leaf}.csr", "-subj", f"/CN={leaf}")
        (d / f"{leaf}.ext").write_text(ext)
        _openssl(
            "x509", "-req", "-in", d / f"{leaf}.csr", "-CA", d / "ca.crt", "-CAkey", d / "ca.key", "-CAcreateserial",
            "-out", d / f"{leaf}.crt", "-days", "1", "-extfile", d / f"{leaf}.ext",
        )  # fmt: skip
    return {name: d / name for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def _pod(name: str, cpu: str, memory: str, kind: str) -> dict[str, Any]:
    return burst_pod(name, cpu, memory, kind, "qos-egrpc-e2e")


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, str]]:
    async with autoscaled_namespace("qos-egrpc-e2e") as c:
        yield c


async def _pods(core: Any, ns: str) -> dict[str, Any]:
    items = await read_json(await core.list_namespaced_pod(ns, _preload_content=False))
    return {p["metadata"]["name"]: p for p in items["items"]}


async def _nodes(core: Any) -> dict[str, Any]:
    items = await read_json(await core.list_node(_preload_content=False))
    return {n["metadata"]["name"]: n for n in items["items"]}


def _unschedulable(pod: Any) -> bool:
    if pod is None or pod.get("spec", {}).get("nodeName"):
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions") or []
    )


def _ready(node: Any) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions") or []
    )


async def test_cluster_autoscaler_scale_up_and_down_through_the_externalgrpc_provider(
    cluster: tuple[Any, str], tmp_path: Path
) -> None:
    api, ns = cluster
    core = k8s.CoreV1Api(api)
    t0 = time.monotonic()
    existing = await _nodes(core)
    assert not [n for n in existing.values() if PROVISIONED_BY_LABEL in n["metadata"].get("labels", {})]
    usable = [
        n for n in existing.values() if n["metadata"].get("labels", {}).get("qos.kube-qos-extender.io/node-group")
    ]
    assert not usable, "start from a cluster without node-group nodes: hack/local-up.sh with no node arguments"
    pki = _pki(tmp_path)
    config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=require_kubeconfig(), watch_timeout_seconds=60))
    settings = AutoscalerSettings(
        provider="cluster-autoscaler",
        scheduler_names=("default-scheduler",),
        flavours=FLAVOURS,
        scan_interval_seconds=0.5,
        burst_debounce_seconds=0.2,
        batch_cycle_seconds=5.0,
        idle_seconds=600.0,
        provisioning_timeout_seconds=120.0,
        underutil_sustain_seconds=600.0,
        batch_queue_quiet_seconds=600.0,
        metrics_port=0,
        kwok_lag=LagDistribution("uniform", seconds=4.5, minimum=4.0, maximum=5.0, seed=11),
        expander=CaExpanderSettings(
            listen="127.0.0.1:0",
            cert_file=str(pki["server.crt"]),
            key_file=str(pki["server.key"]),
            cloud_provider=CloudProviderSettings(
                cert_file=str(pki["server.crt"]),
                key_file=str(pki["server.key"]),
                client_ca_file=str(pki["ca.crt"]),
                listen="127.0.0.1:0",
                max_size=3,
            ),
        ),
    )
    running: RunningAutoscaler = await start_autoscaler(config, settings)
    cp = running.cloud_provider
    client, channel = CloudProviderClient.dial(
        CloudConfig(f"127.0.0.1:{cp.port}", str(pki["client.crt"]), str(pki["client.key"]), str(pki["ca.crt"]))
    )
    expander_channel = grpc.aio.secure_channel(
        f"127.0.0.1:{running.expander.port}", grpc.ssl_channel_credentials(pki["ca.crt"].read_bytes())
    )
    replay = ReplayedAutoscaler(client, expander=load_expander().grpc.ExpanderStub(expander_channel))
    try:
        await _until("the sidecar's first scan", 30, lambda: _scanned(running))
        # ---- two memory-heavy service pods nothing can hold yet
        names = ["svc-0", "svc-1"]
        for name in names:
            body = _pod(name, "300m", "2500Mi", "service")
            await read_json(await core.create_namespaced_pod(ns, body, _preload_content=False))

        async def all_unschedulable() -> bool:
            pods = await _pods(core, ns)
            return all(_unschedulable(pods.get(n)) for n in names)

        await _until("both pods Unschedulable", 30, all_unschedulable)
        pending = list((await _pods(core, ns)).values())
        want = autoscale.plan_pods(
            [Pod(f"{ns}/{n}", Resources.request(300, 2500 * MI)) for n in names],
            list(FLAVOURS),
            autoscale.ScoreWeights(),
        ).nodes[0][0]
        group = f"service-{want.name}"

        # ---- CA loop 1: options, expanders, IncreaseSize
        best, options, scores = await replay.run_once(list((await _nodes(core)).values()), pending)
        assert best is not None and best.node_group == group, (best, scores)
        assert "BestOptions" in client.calls and client.calls[-1] == "NodeGroupIncreaseSize"
        assert min(scores, key=lambda g: scores[g]) == group  # CA's price expander on our prices agrees
        t_buy = time.monotonic() - t0
        count = best.node_count
        assert await client.target_size(group) == count
        instances = await client.nodes(group)
        assert len(instances) == count and all(state == CREATING for _, state in instances)
        ids = {i for i, _ in instances}

        # ---- loops while the node boots: nothing is bought twice; the dry-run loop plans against the ledger too
        best2, _, _ = await replay.run_once(list((await _nodes(core)).values()), pending)
        assert best2 is None and replay.upcoming_riders == len(names)
        assert client.calls.count("NodeGroupIncreaseSize") == 1
        seen: list[Any] = []

        async def scan_sees_the_booting_node() -> bool:  # the node boots 4-5 s; the loop scans every 0.5 s
            if running.last is not None and running.last.provisioning == count:
                seen.append(running.last)
            return bool(seen)

        await _until("a planning scan that counts the booting node", 4.0, scan_sees_the_booting_node, every=0.05)
        assert seen[0].unschedulable[NodeGroup.SERVICE] == len(names)
        assert seen[0].uncovered[NodeGroup.SERVICE] == 0 and not any(p.pods for p in seen[0].plans)

        # ---- the kwok node registers Ready with the instance's id; the pods run on it
        async def registered() -> bool:
            nodes = await _nodes(core)
            return any(n["spec"].get("providerID") in ids and _ready(n) for n in nodes.values())

        await _until("the new node Ready", 60, registered)
        t_ready = time.monotonic() - t0

        async def all_running() -> bool:
            pods = await _pods(core, ns)
            return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

        await _until("both pods Running", 60, all_running)
        nodes = await _nodes(core)
        ours = [n for n in nodes.values() if n["spec"].get("providerID") in ids]
        assert len(ours) == count
        await replay.run_once(list(nodes.values()), [])
        assert await client.target_size(group) == count
        assert sorted(await client.nodes(group)) == sorted((i, RUNNING) for i in ids)
        for node in ours:
            found = await client.node_group_for_node(node)
            assert found is not None and found.id == group
            assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == want.name
        pods = await _pods(core, ns)
        assert {pods[n]["spec"]["nodeName"] for n in names} <= {n["metadata"]["name"] for n in ours}

        async def lag_learned() -> bool:  # the provider saw the arrival; the loop takes it at its next scan
            return len(running.loop.lag_samples) >= count

        await _until("the arrival's lag in the planning loop", 5, lag_learned)
        lags = running.loop.lag_samples[-count:]
        assert all(3.5 <= lag <= 12.0 for lag in lags), lags

        # ---- scale-down: the pods go, CA removes the unneeded node
        await read_json(
            await core.delete_collection_namespaced_pod(ns, _preload_content=False, label_selector="app=qos-egrpc-e2e")
        )
        t_down = time.monotonic()
        for node in ours:
            assert await replay.scale_down(node) == group
        assert await client.target_size(group) == 0

        async def gone() -> bool:
            left = await _nodes(core)
            return not any(n["spec"].get("providerID") in ids for n in left.values())

        await _until("the node deleted", 30, gone)
        t_gone = time.monotonic() - t_down
        assert await client.nodes(group) == []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.target_size("no-such-group")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        await client.cleanup()
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{running.metrics_port}/metrics") as resp,
        ):
            text = await resp.text()
        assert f'cloudprovider_nodes_total{{action="requested",node_group="{group}"}} {float(count)}' in text
        assert f'cloudprovider_nodes_total{{action="deleted",node_group="{group}"}} {float(count)}' in text
        print(
            f"\nexternalgrpc e2e: bought {count}x {want.name} at {t_buy:.1f}s, node Ready at {t_ready:.1f}s, "
            f"lags {[round(x, 1) for x in lags]}, deleted {t_gone:.1f}s after DeleteNodes; "
            f"{len(client.calls)} CA calls, options {sorted(o.node_group for o in options)}"
        )
    finally:
        await expander_channel.close()
        await channel.close()
        await running.stop()


async def _scanned(running: RunningAutoscaler) -> bool:
    return running.scans > 0
