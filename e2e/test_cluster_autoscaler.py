"""Capacity from the real cluster-autoscaler 1.35.2 for gated qos pods (issue 27), in both of CA's modes:

* ``kwok``: CA's own cloud provider (``--cloud-provider=kwok``: node groups from template Nodes, which stands for a
  cloud's node groups here) with our sidecar as its gRPC expander;
* ``externalgrpc``: CA's ``--cloud-provider=externalgrpc`` with our sidecar as the cloud provider (our flavours as
  its node groups; nodes from the sidecar's kwok backend, the local STAND-IN FOR A CLOUD API) and as expander.

The rest is real: kube-apiserver, kube-scheduler with the qos-scheduler profile, the extender with its QoS
controller (admission webhook: gate + routing marker), kwok. 30 qos pods of mixed classes and kinds plus one
default-scheduler pod arrive on a cluster with no node of any group. Checked: the gated pods reach CA only as our
ProvisioningRequests (one per flavour, a pod set per planned node, no routing marker), CA buys exactly the nodes
our planner chose for them, all 30 bind, gold before bronze; the default-scheduler pod gets a node through CA's
ordinary scale-up and our expander; nothing is bought twice; once the pods end, CA alone removes every node (the
sidecar deletes none). Needs KUBECONFIG and the CA binaries (hack/build-ca.sh): fails, never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from e2e.ca_support import (
    FLAVOURS,
    apply_provisioning_request_crd,
    cluster_autoscaler,
    kwok_provider_configmaps,
    kwok_templates,
    pki,
)
from e2e.kwok_autoscaling import until
from extender.autoscaler.providers.provisioning_request import CONSUME_ANNOTATION, ProvisioningRequestProvider
from extender.autoscaler.settings import (
    AutoscalerSettings,
    CaExpanderSettings,
    CloudProviderSettings,
    KwokSettings,
    LagDistribution,
    MetricsSettings,
    ProvisioningRequestSettings,
)
from extender.consolidation.policy import cordon_patch
from extender.kube.client import ApiError, new_api_client, read_json
from extender.processes.sidecar import start_autoscaler
from extender.settings.extender import ExtenderConfig, KubernetesConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

GROUP_LABEL = "qos.kube-qos-extender.io/node-group"
PRICES = {f.name: f.price_per_hour for f in FLAVOURS}
# (class, kind, count, cpu, memory, runtime): 30 pods, every class in both kinds, cpu- and memory-heavy shapes
WORKLOAD = (
    ("gold", "service", 4, "500m", "1Gi", None),
    ("silver", "service", 6, "900m", "1Gi", None),
    ("bronze", "service", 4, "250m", "3Gi", None),
    ("gold", "batch", 4, "1500m", "512Mi", 600),
    ("silver", "batch", 6, "700m", "1Gi", 1200),
    ("bronze", "batch", 6, "300m", "2Gi", 300),
)


def _pod(name: str, cls: str, kind: str, cpu: str, memory: str, runtime: int | None) -> dict[str, Any]:
    ann = {"qos.kube-qos-extender.io/class": cls, "qos.kube-qos-extender.io/kind": kind}
    if runtime is not None:
        ann["qos.kube-qos-extender.io/runtime-seconds"] = str(runtime)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": ann, "labels": {"app": "ca-e2e", "class": cls}},
        "spec": {
            "schedulerName": "qos-scheduler",  # the admission webhook adds the gate and the routing marker
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


def _default_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "ca-e2e", "class": "default"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {GROUP_LABEL: "service"},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }


async def _nodes(core: Any) -> dict[str, Any]:
    items = await read_json(await core.list_node(_preload_content=False))
    return {n["metadata"]["name"]: n for n in items["items"]}


def _grouped(node: dict[str, Any]) -> bool:
    return GROUP_LABEL in (node["metadata"].get("labels") or {})


async def _delete_nodes(core: Any) -> None:
    for name, node in (await _nodes(core)).items():
        if _grouped(node):
            with contextlib.suppress(ApiError):
                await read_json(await core.delete_node(name, _preload_content=False))


@pytest.mark.parametrize("mode", ["kwok", "externalgrpc"])
async def test_gated_qos_pods_scale_a_real_cluster_autoscaler(mode: str, tmp_path: Path) -> None:
    kubeconfig = require_kubeconfig()
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    ns = f"ca-{mode[:4]}-{int(time.time()) % 100000}"
    assert not [n for n in (await _nodes(core)).values() if _grouped(n)], "needs a cluster with no node-group nodes"
    await read_json(await core.create_namespace({"metadata": {"name": ns}}, _preload_content=False))
    apply_provisioning_request_crd()
    certs = pki(tmp_path)
    cloud = None
    if mode == "externalgrpc":
        cloud = CloudProviderSettings(
            cert_file=str(certs["server.crt"]),
            key_file=str(certs["server.key"]),
            client_ca_file=str(certs["ca.crt"]),
            listen="127.0.0.1:0",
            max_size=10,
        )
    else:
        kwok_provider_configmaps(ns, kwok_templates(FLAVOURS, ("service", "batch")))
    settings = AutoscalerSettings(
        provider="cluster-autoscaler",
        scheduler_names=("qos-scheduler",),
        flavours=FLAVOURS,
        scan_interval_seconds=1.0,
        burst_debounce_seconds=0.2,
        batch_cycle_seconds=5.0,
        idle_seconds=600.0,
        provisioning_timeout_seconds=240.0,
        underutil_sustain_seconds=600.0,
        batch_queue_quiet_seconds=600.0,
        metrics=MetricsSettings(port=0),
        kwok=KwokSettings(lag=LagDistribution(distribution="uniform", seconds=1.5, minimum=1.0, maximum=2.0, seed=5)),
        cluster_autoscaler=CaExpanderSettings(
            listen="127.0.0.1:0",
            cert_file=str(certs["server.crt"]),
            key_file=str(certs["server.key"]),
            cloud_provider=cloud,
            provisioning_requests=ProvisioningRequestSettings(namespace=ns, delivered_grace_seconds=30.0),
        ),
    )
    config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=kubeconfig, watch_timeout_seconds=60))
    running = await start_autoscaler(config, settings)
    provider = running.provider
    assert isinstance(provider, ProvisioningRequestProvider)
    extra = [
        "--expander=grpc",
        f"--grpc-expander-url=127.0.0.1:{running.expander.port}",
        f"--grpc-expander-cert={certs['ca.crt']}",
    ]
    if mode == "externalgrpc":
        cc = tmp_path / "cloud-config.yaml"
        cc.write_text(
            f"address: 127.0.0.1:{running.cloud_provider.port}\ncert: {certs['client.crt']}\n"
            f"key: {certs['client.key']}\ncacert: {certs['ca.crt']}\ngrpc_timeout: 10s\n"
        )
        extra += ["--cloud-provider=externalgrpc", f"--cloud-config={cc}"]
    else:
        extra += ["--cloud-provider=kwok"]
    log_path = tmp_path / f"cluster-autoscaler-{mode}.log"
    bound_at: dict[str, float] = {}
    try:
        with cluster_autoscaler(mode, ns, kubeconfig, log_path, extra):
            await until("the sidecar's first scan", 30, lambda: _true(running.scans > 0))
            # One burst: the default-scheduler pod with the qos pods. The controller may pin a qos pod to a node CA
            # bought while kube-scheduler's default profile puts default-0 there first; that pod is then re-queued
            # (controller.requeue_pinned_seconds, QoSRequeued) instead of waiting for ever.
            t0 = time.monotonic()
            classes: dict[str, str] = {"default-0": "default"}
            await read_json(await core.create_namespaced_pod(ns, _default_pod("default-0"), _preload_content=False))
            for cls, kind, count, cpu, memory, runtime in WORKLOAD:
                for i in range(count):
                    name = f"{cls}-{kind}-{i}"
                    classes[name] = cls
                    body = _pod(name, cls, kind, cpu, memory, runtime)
                    await read_json(await core.create_namespaced_pod(ns, body, _preload_content=False))

            async def all_bound() -> bool:
                items = await read_json(await core.list_namespaced_pod(ns, _preload_content=False))
                now = time.monotonic() - t0
                for p in items["items"]:
                    if p["spec"].get("nodeName"):
                        bound_at.setdefault(p["metadata"]["name"], now)
                return len(bound_at) == len(classes)

            await until("all 31 pods bound", 240, all_bound, every=0.25)
            default_seconds = bound_at["default-0"]

            # ---- fulfilled requests are deleted (CA's booking ends); awaited before the purchases are compared, so
            # every request has its outcome (one whose pods bound elsewhere is withdrawn unbought)
            async def requests_gone() -> bool:
                got = await read_json(
                    await custom.list_namespaced_custom_object(
                        "autoscaling.x-k8s.io", "v1", ns, "provisioningrequests", _preload_content=False
                    )
                )
                return not got["items"]

            await until("our ProvisioningRequests deleted once their pods bound", 60, requests_gone)
            assert all(req.outcome is not None for req in provider.history), [
                (r.name, r.outcome) for r in provider.history
            ]
            pods = {
                p["metadata"]["name"]: p
                for p in (await read_json(await core.list_namespaced_pod(ns, _preload_content=False)))["items"]
            }
            events = await read_json(
                await core.list_namespaced_event(ns, field_selector="reason=QoSRequeued", _preload_content=False)
            )
            requeued = sorted({e["involvedObject"]["name"] for e in events["items"]})
            nodes = await _nodes(core)
            made = {n: v for n, v in nodes.items() if _grouped(v)}
            flavour_of = {n: v["metadata"]["labels"]["node.kubernetes.io/instance-type"] for n, v in made.items()}

            # ---- every node CA bought is one we chose: a planned node of our requests, or our expander's answer
            # to CA's ordinary scale-up (the default-scheduler pod, and qos pods a gate released unpinned)
            text = await _metrics(running.metrics_port)
            chosen = _samples(text, "qos_extender_autoscaler_expander_chosen_nodes_total", "flavour", demand="pods")
            for_requests = _samples(
                text, "qos_extender_autoscaler_expander_chosen_nodes_total", "flavour", demand="provisioning-request"
            )
            planned: Counter[str] = Counter()
            for req in provider.history:
                planned[req.flavour] += len(req.nodes)
            bought = Counter(flavour_of.values())
            in_requests = {k.split("/", 1)[1] for req in provider.history for ps in req.nodes.values() for k in ps}
            annotated = {n for n in classes if (pods[n]["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION)}
            diag = (
                f"bought {dict(bought)}, requests {[(r.name, r.flavour, len(r.nodes)) for r in provider.history]}, "
                f"expander for pods {dict(chosen)}, for requests {dict(for_requests)}, "
                f"bound {sorted((round(t, 1), n) for n, t in bound_at.items())}\n" + _tail(log_path)
            )
            assert provider.history, "no ProvisioningRequest was made\n" + diag
            # every pod of a request says so to CA (never bought twice), but a pod the controller re-queued: its copy
            # drops the annotation with the pin (its former request's room was taken; it is planned afresh)
            # (it carries the annotation again if a new request was planned for it)
            assert annotated - set(requeued) == in_requests - set(requeued), (requeued, diag)
            # Exactly our choice: never a node beyond it, and every node of it bought except those of requests we
            # withdrew before CA reported them Provisioned (their pods bound elsewhere first: deleted unbought, seen
            # once, a 1-node e2e.cpu request; or CA failed them and they were planned again).
            chosen_total = planned + Counter({f: int(n) for f, n in chosen.items()})
            unbought: Counter[str] = Counter()
            for req in provider.history:
                if req.outcome in ("failed", "timed_out", "deleted") or (
                    req.outcome == "fulfilled" and req.provisioned_at is None
                ):
                    unbought[req.flavour] += len(req.nodes)
            assert not bought - chosen_total, diag  # nothing CA chose on its own
            # every node of our requests that CA provisioned was bought. Not asked of the expander's answers for
            # ordinary pods: CA picks one of its options through us, then may never scale (the pods bound to
            # capacity that appeared meanwhile) -- seen once in CI, 7 e2e.std chosen, 6 bought, no request unbought.
            assert not (planned - unbought) - bought, (dict(unbought), diag)
            # (expander_chosen_nodes_total{demand="provisioning-request"} usually equals `planned`; it fell short once
            # in nine runs under load with CA's log showing every request scaled up through the expander: reported,
            # not asserted. A request can be fulfilled before a scan saw it Provisioned: provisioned_at not asserted.)
            # nothing bought for nothing: every node holds a pod once all are bound
            used = {p["spec"]["nodeName"] for p in pods.values()}
            assert set(made) <= used, (sorted(set(made) - used), diag)

            # ---- Q order: gold binds before bronze
            by_class: dict[str, list[float]] = {}
            for name, t in bound_at.items():
                # (a re-queued pod's time includes requeue_pinned_seconds of the race it recovered from)
                if classes[name] != "default" and name not in requeued:
                    by_class.setdefault(classes[name], []).append(t)
            med = {c: statistics.median(ts) for c, ts in by_class.items()}
            # released in Q order as room appears: gold's median and last bind come no later than bronze's (a node a
            # request planned for bronze pods is taken by gold pods when it joins first; bronze is planned again)
            assert med["gold"] <= med["bronze"] and max(by_class["gold"]) <= max(by_class["bronze"]), by_class
            cost = sum(PRICES[f] for f in flavour_of.values())

            # ---- the default-scheduler pod: CA's ordinary scale-up asked our expander
            assert _samples(text, "qos_extender_autoscaler_expander_requests_total", "outcome").get("ok", 0) >= 1
            assert "qos_extender_autoscaler_provisioning_request_nodes_total" in text

            # ---- once the pods end, CA alone removes the nodes, never one we hold: (kwok mode) a node we
            # are emptying by migration carries scale-down-disabled (consolidation.policy.cordon_patch), and a pod
            # the controller pinned keeps its node
            kept: set[str] = set()
            keep_pod = ""
            if mode == "kwok":
                keep_pod = next(
                    n
                    for n in sorted(classes)
                    if classes[n] == "gold" and _pinned_to(pods[n]) == pods[n]["spec"]["nodeName"]
                )
                pinned_node = pods[keep_pod]["spec"]["nodeName"]
                held = next(n for n in sorted(made) if n != pinned_node)
                await read_json(await core.patch_node(held, cordon_patch("e2e-plan"), _preload_content=False))
                kept = {pinned_node, held}
            await read_json(
                await core.delete_collection_namespaced_pod(
                    ns, label_selector="app=ca-e2e", field_selector=f"metadata.name!={keep_pod or '-'}",
                    _preload_content=False,
                )
            )  # fmt: skip
            t_end = time.monotonic()

            async def only_kept() -> bool:
                return {n for n, v in (await _nodes(core)).items() if _grouped(v)} == kept

            await until("every other node removed by cluster-autoscaler", 180, only_kept, every=1.0)
            t_removed = time.monotonic() - t_end
            if kept:
                await asyncio.sleep(20.0)  # two scale-down-unneeded periods more: CA still leaves both
                assert await only_kept(), (kept, _tail(log_path))
                await read_json(await core.patch_node(held, cordon_patch(None), _preload_content=False))
                await read_json(await core.delete_namespaced_pod(keep_pod, ns, _preload_content=False))

                async def removed() -> bool:
                    return not [n for n in (await _nodes(core)).values() if _grouped(n)]

                await until("the released nodes removed by cluster-autoscaler", 180, removed, every=1.0)
            text = await _metrics(running.metrics_port)
            assert 'qos_extender_autoscaler_scaled_down_nodes_total{reason="idle"} 0.0' in text
            log = log_path.read_text(errors="replace")
            assert "Scale-down: removing empty node" in log or "removing empty node" in log, _tail(log_path)
            print(
                f"\nCA e2e ({mode}): default-scheduler pod bound {default_seconds:.1f} s after creation; "
                f"qos pods bound s after creation, median per class "
                f"{ {c: round(v, 1) for c, v in sorted(med.items())} }, max per class "
                f"{ {c: round(max(v), 1) for c, v in sorted(by_class.items())} }; nodes bought "
                f"{dict(sorted(bought.items()))} ${cost:.2f}/h, planned {dict(sorted(planned.items()))} in "
                f"{len(provider.history)} requests ({dict(unbought)} withdrawn before provisioned), expander answers "
                f"{dict(chosen)}; "
                f"all nodes removed by CA {t_removed:.0f} s after the pods ended; re-queued (pin lost) {requeued}"
            )
    finally:
        await running.stop()
        await _delete_nodes(core)
        with contextlib.suppress(ApiError):
            await read_json(await core.delete_namespace(ns, _preload_content=False))
        await api.close()


def _samples(text: str, name: str, label: str, **match: str) -> dict[str, float]:
    """label value -> sample value of one metric family in a Prometheus exposition, among the samples whose
    other labels include ``match``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == name and label in labels and all(labels.get(k) == v for k, v in match.items()):
                out[labels[label]] = out.get(labels[label], 0.0) + float(sample.value)
    return out


def _pinned_to(pod: dict[str, Any]) -> str | None:
    """The node the QoS controller pinned this pod to (matchFields metadata.name In [node]), if any."""
    terms = (
        ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(f.get("values") or []) == 1:
                return str(f["values"][0])
    return None


async def _true(value: bool) -> bool:
    return value


async def _metrics(port: int) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        return await resp.text()


def _tail(path: Path, n: int = 60) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return ""
