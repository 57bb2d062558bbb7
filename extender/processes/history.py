"""The shell of ``qos-extender simulate --from-cluster``: read a live cluster's nodes and pods from the API server,
and what Prometheus still has of the deleted ones (kube-state-metrics' ``kube_node_*`` / ``kube_pod_*`` series)
plus the autoscaler sidecar's own cost gauge, into the plain :class:`extender.sim.from_cluster.ClusterHistory` the
simulator's pure conversion takes.

The parsing functions (``nodes_from_k8s``, ``pods_from_k8s``, ``from_prometheus``) are pure and unit-tested on
hand-built objects; :func:`read_history` is the I/O. Annotations are read as the extender reads them
(``kube.convert.pod_settings``): a malformed one gets the documented default and is counted as a problem.

Any failure to reach the API server or Prometheus raises ``InvalidInputError`` with one line saying which and
why (the command prints it and exits 2).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.core.model import InvalidInputError, NodeGroup, ServiceClass, cpu_millicores, memory_bytes
from extender.kube.convert import (
    node_group_of,
    parse_timestamp,
    pod_requests,
    pod_settings,
    pod_started_at,
)
from extender.settings.sections import NodeGroupsConfig, PodDefaults
from extender.sim.from_cluster import ClusterHistory, ObservedNode, ObservedPod

__all__ = [
    "PRICE_ANNOTATION",
    "PromQueries",
    "from_prometheus",
    "nodes_from_k8s",
    "pods_from_k8s",
    "read_history",
]

PRICE_ANNOTATION = "qos.kube-qos-extender.io/price-per-hour"
_CONTROL_PLANE = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
SYSTEM_NAMESPACES = ("kube-system",)


def _map(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _capacity(node: Mapping[str, Any]) -> tuple[int | None, int | None]:
    status = _map(node.get("status"))
    cap = status.get("capacity") or status.get("allocatable") or {}
    try:
        cpu = cpu_millicores(cap["cpu"]) if "cpu" in cap else None
        mem = memory_bytes(cap["memory"]) if "memory" in cap else None
    except (InvalidInputError, TypeError, ValueError):
        return None, None
    return cpu, mem


def nodes_from_k8s(items: Iterable[Mapping[str, Any]], groups: NodeGroupsConfig) -> tuple[list[ObservedNode], int]:
    """API Node objects -> observations; control-plane nodes are left out (returned: how many)."""
    out: list[ObservedNode] = []
    control = 0
    for node in items:
        meta = _map(node.get("metadata"))
        labels = _map(meta.get("labels"))
        annotations = _map(meta.get("annotations"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        if any(k in labels for k in _CONTROL_PLANE):
            control += 1
            continue
        cpu, mem = _capacity(node)
        price = annotations.get(PRICE_ANNOTATION) or labels.get(PRICE_ANNOTATION)
        out.append(
            ObservedNode(
                name=name,
                created=parse_timestamp(meta.get("creationTimestamp")),
                deleted=None,
                cpu_milli=cpu,
                memory_bytes=mem,
                flavour_label=labels.get(groups.flavour_label),
                price_annotation=price if isinstance(price, str) else None,
                groups=node_group_of({str(k): str(v) for k, v in labels.items()}, groups),
            )
        )
    return out, control


def _finished_at(pod: Mapping[str, Any]) -> float | None:
    """When a Succeeded / Failed pod ended: its containers' last finishedAt, else its last condition change."""
    status = _map(pod.get("status"))
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    ends: list[float] = []
    for cs in status.get("containerStatuses") or []:
        term = ((cs or {}).get("state") or {}).get("terminated") if isinstance(cs, dict) else None
        t = parse_timestamp(term.get("finishedAt")) if isinstance(term, dict) else None
        if t is not None:
            ends.append(t)
    if not ends:
        for cond in status.get("conditions") or []:
            t = parse_timestamp(cond.get("lastTransitionTime")) if isinstance(cond, dict) else None
            if t is not None:
                ends.append(t)
    return max(ends) if ends else None


def _owner_kind(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            kind = ref.get("kind")
            return kind if isinstance(kind, str) else None
    return None


def pods_from_k8s(
    items: Iterable[Mapping[str, Any]],
    defaults: PodDefaults,
    classes: Mapping[str, ServiceClass],
    namespaces: Sequence[str] = (),
    nodes: set[str] | None = None,
) -> tuple[list[ObservedPod], dict[str, int]]:
    """API Pod objects -> observations, and the pods left out by reason. ``namespaces`` empty: every namespace but
    kube-system; ``nodes``: only pods bound to these nodes (and pods bound to none)."""
    out: list[ObservedPod] = []
    excluded: dict[str, int] = {}

    def skip(reason: str) -> None:
        excluded[reason] = excluded.get(reason, 0) + 1

    for pod in items:
        meta = _map(pod.get("metadata"))
        spec = _map(pod.get("spec"))
        status = _map(pod.get("status"))
        ns, name = meta.get("namespace") or "default", meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        if namespaces and ns not in namespaces:
            continue
        if not namespaces and ns in SYSTEM_NAMESPACES:
            skip(f"in {ns} (system pods; --namespace {ns} to include them)")
            continue
        if _owner_kind(meta) == "DaemonSet" or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
            skip("DaemonSet and static pods (they come with every node, whatever the policy)")
            continue
        node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None
        if nodes is not None and node and node not in nodes:
            skip("bound to a node outside --node-selector")
            continue
        try:
            req = pod_requests(pod)
            settings = pod_settings(pod, defaults, classes)
        except InvalidInputError as exc:
            skip(f"unreadable spec ({exc})")
            continue
        out.append(
            ObservedPod(
                key=f"{ns}/{name}",
                created=parse_timestamp(meta.get("creationTimestamp")),
                cpu_milli=req.cpu_milli,
                memory_bytes=req.memory_bytes,
                class_name=settings.class_name,
                kind=settings.kind,
                started=pod_started_at(pod) if node else None,
                finished=_finished_at(pod),
                phase=str(status.get("phase") or "Pending"),
                node=node,
                runtime_seconds=settings.runtime_seconds,
                problems=tuple(str(p) for p in settings.problems),
            )
        )
    return out, excluded


# ---------------------------------------------------------------------------------------------- Prometheus


@dataclass(frozen=True, slots=True)
class PromQueries:
    """The instant queries asked at the reading time, over the window (``w`` seconds, subquery step ``s``)."""

    w: int
    s: int

    def all(self) -> dict[str, str]:
        w, s = f"{self.w}s", f"{self.s}s"
        return {
            "node_created": f"last_over_time(kube_node_created[{w}])",
            "node_last_seen": f"max_over_time(timestamp(kube_node_created)[{w}:{s}])",
            "node_capacity": f'last_over_time(kube_node_status_capacity{{resource=~"cpu|memory"}}[{w}])',
            "node_labels": f"last_over_time(kube_node_labels[{w}])",
            "pod_created": f"last_over_time(kube_pod_created[{w}])",
            "pod_last_seen": f"max_over_time(timestamp(kube_pod_created)[{w}:{s}])",
            "pod_start": f"last_over_time(kube_pod_start_time[{w}])",
            "pod_completion": f"last_over_time(kube_pod_completion_time[{w}])",
            "pod_requests": "sum by (namespace, pod, resource) (last_over_time("
            f'kube_pod_container_resource_requests{{resource=~"cpu|memory"}}[{w}]))',
            "pod_info": f"last_over_time(kube_pod_info[{w}])",
            "pod_annotations": f"last_over_time(kube_pod_annotations[{w}])",
            # the autoscaler sidecar's own gauge ($/h of the catalogued nodes), integrated over the window
            "own_cost": f"sum(sum_over_time(qos_extender_autoscaler_nodes_cost_dollars_per_hour[{w}:{s}])) "
            f"* {self.s} / 3600",
        }


def _series(doc: Any) -> list[tuple[dict[str, str], float]]:
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise InvalidInputError(f"Prometheus answered {str(doc)[:200]}")
    data = doc.get("data") or {}
    out: list[tuple[dict[str, str], float]] = []
    for row in data.get("result") or []:
        try:
            value = float(row["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            out.append(({str(k): str(v) for k, v in (row.get("metric") or {}).items()}, value))
    return out


def _label_name(key: str, prefix: str) -> str:
    """kube-state-metrics' label for a Kubernetes label/annotation key: prefix + the key with every character
    outside [a-zA-Z0-9_] replaced by _."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def from_prometheus(
    docs: Mapping[str, Any],
    *,
    known_nodes: set[str],
    known_pods: set[str],
    now: float,
    step: float,
    groups: NodeGroupsConfig,
    defaults: PodDefaults,
    classes: Mapping[str, ServiceClass],
    namespaces: Sequence[str] = (),
) -> tuple[list[ObservedNode], list[ObservedPod], list[str], float | None]:
    """Deleted nodes and pods (those not in the API's lists) from kube-state-metrics' series, notes on what was
    missing, and the sidecar's own cost over the window (None: not scraped). A series last seen more than two
    steps before ``now`` is an object deleted then."""
    notes: list[str] = []
    node_created = {m.get("node", ""): v for m, v in _series(docs["node_created"])}
    node_seen = {m.get("node", ""): v for m, v in _series(docs["node_last_seen"])}
    caps: dict[str, dict[str, float]] = {}
    for m, v in _series(docs["node_capacity"]):
        caps.setdefault(m.get("node", ""), {})[m.get("resource", "")] = v
    node_labels = {m.get("node", ""): m for m, _ in _series(docs["node_labels"])}
    gone_before = now - 2 * step
    nodes: list[ObservedNode] = []
    if not node_created:
        notes.append(
            "Prometheus has no kube-state-metrics node series (kube_node_created): nodes deleted before the "
            "reading are invisible (their cost is missing from the actual bill)"
        )
    flavour_key = _label_name(groups.flavour_label, "label_")
    for name, created in sorted(node_created.items()):
        if not name or name in known_nodes:
            continue
        last = node_seen.get(name, now)
        labels = node_labels.get(name, {})
        cap = caps.get(name, {})
        kube_labels = {k[len("label_") :]: v for k, v in labels.items() if k.startswith("label_")}
        nodes.append(
            ObservedNode(
                name=name,
                created=created,
                deleted=last if last < gone_before else now,
                cpu_milli=round(cap["cpu"] * 1000) if "cpu" in cap else None,
                memory_bytes=round(cap["memory"]) if "memory" in cap else None,
                flavour_label=labels.get(flavour_key),
                groups=_groups_from_ksm(kube_labels, groups),
                source="prometheus",
            )
        )
    pod_created = {_pkey(m): v for m, v in _series(docs["pod_created"])}
    if not pod_created:
        notes.append(
            "Prometheus has no kube-state-metrics pod series (kube_pod_created): pods deleted before the reading "
            "are invisible (their SLIs are missing from the observed figures and the replay)"
        )
    pod_seen = {_pkey(m): v for m, v in _series(docs["pod_last_seen"])}
    pod_start = {_pkey(m): v for m, v in _series(docs["pod_start"])}
    pod_done = {_pkey(m): v for m, v in _series(docs["pod_completion"])}
    reqs: dict[str, dict[str, float]] = {}
    for m, v in _series(docs["pod_requests"]):
        reqs.setdefault(_pkey(m), {})[m.get("resource", "")] = v
    info = {_pkey(m): m for m, _ in _series(docs["pod_info"])}
    annotations = {_pkey(m): m for m, _ in _series(docs["pod_annotations"])}
    pods: list[ObservedPod] = []
    unannotated = 0
    for key, created in sorted(pod_created.items()):
        ns = key.split("/", 1)[0]
        if key in known_pods or (namespaces and ns not in namespaces) or (not namespaces and ns in SYSTEM_NAMESPACES):
            continue
        meta = info.get(key, {})
        if meta.get("created_by_kind") == "DaemonSet":
            continue
        ann_labels = annotations.get(key, {})
        ann = {
            f"qos.kube-qos-extender.io/{k}": ann_labels[_label_name(f"qos.kube-qos-extender.io/{k}", "annotation_")]
            for k in ("class", "kind", "runtime-seconds")
            if _label_name(f"qos.kube-qos-extender.io/{k}", "annotation_") in ann_labels
        }
        if not ann:
            unannotated += 1
        settings = pod_settings({"metadata": {"annotations": ann}, "spec": {}}, defaults, classes)
        last = pod_seen.get(key, now)
        started = pod_start.get(key)
        finished = pod_done.get(key)
        if finished is None and last < gone_before:
            finished = last  # deleted while running: it ran until it was last seen
        r = reqs.get(key, {})
        pods.append(
            ObservedPod(
                key=key,
                created=created,
                cpu_milli=round(r.get("cpu", 0.0) * 1000),
                memory_bytes=round(r.get("memory", 0.0)),
                class_name=settings.class_name,
                kind=settings.kind,
                started=started,
                finished=finished,
                phase="Deleted",
                node=meta.get("node") or None,
                runtime_seconds=settings.runtime_seconds,
                problems=tuple(str(p) for p in settings.problems),
                source="prometheus",
            )
        )
    if nodes or pods:
        notes.append(
            f"{len(nodes)} deleted node(s) and {len(pods)} deleted pod(s) recovered from kube-state-metrics' "
            "series; a deleted object's end is when its series was last seen"
        )
    if unannotated:
        notes.append(
            f"{unannotated} deleted pod(s) without their qos annotations in Prometheus (kube_pod_annotations "
            "needs --metric-annotations-allowlist): given the default class and kind"
        )
    own = _series(docs["own_cost"])
    return nodes, pods, notes, (own[0][1] if own else None)


def _pkey(m: Mapping[str, str]) -> str:
    return f"{m.get('namespace', '')}/{m.get('pod', '')}"


def _groups_from_ksm(labels: Mapping[str, str], groups: NodeGroupsConfig) -> frozenset[NodeGroup]:
    """kube-state-metrics' label names have the key's punctuation replaced by _: match the selectors that way."""
    sanitized = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in groups.batch_selector.items()}
    service = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in groups.service_selector.items()}
    out: set[NodeGroup] = set()
    if sanitized and all(labels.get(k) == v for k, v in sanitized.items()):
        out.add(NodeGroup.BATCH)
    if service and all(labels.get(k) == v for k, v in service.items()):
        out.add(NodeGroup.SERVICE)
    return frozenset(out)


# ---------------------------------------------------------------------------------------------------- I/O


async def _list_all(fn: Any, **kw: Any) -> list[dict[str, Any]]:
    from extender.kube.client import read_json

    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        args: dict[str, Any] = {"limit": 500, "_preload_content": False, "_request_timeout": 30, **kw}
        if token:
            args["_continue"] = token
        page = await read_json(await fn(**args))
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


async def _prometheus(url: str, queries: Mapping[str, str], at: float) -> dict[str, Any]:
    import aiohttp

    out: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        for name, q in queries.items():
            async with session.get(f"{url.rstrip('/')}/api/v1/query", params={"query": q, "time": f"{at:.3f}"}) as r:
                try:
                    doc = await r.json(content_type=None)
                except ValueError as exc:
                    raise InvalidInputError(f"Prometheus at {url} did not answer JSON (HTTP {r.status})") from exc
                if r.status >= 400:
                    raise InvalidInputError(f"Prometheus at {url}: HTTP {r.status}: {str(doc)[:200]}")
                out[name] = doc
    return out


async def read_history(
    *,
    kubeconfig: str | None,
    context: str | None,
    since_seconds: float,
    namespaces: Sequence[str],
    node_selector: str | None,
    prometheus_url: str | None,
    classes: Mapping[str, ServiceClass],
    defaults: PodDefaults | None = None,
    groups: NodeGroupsConfig | None = None,
) -> ClusterHistory:
    """Read the cluster (and Prometheus); any failure to reach either becomes one InvalidInputError line."""
    import aiohttp
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio.config import ConfigException

    from extender.kube.client import ApiError, new_api_client
    from extender.settings.sections import KubernetesConfig

    defaults = defaults or PodDefaults()
    groups = groups or NodeGroupsConfig()
    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        raise InvalidInputError(f"--kubeconfig {kubeconfig}: no such file")
    try:
        api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig, context=context))
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        raise InvalidInputError(f"cannot load the kubeconfig: {exc}") from exc
    server = str(getattr(api.configuration, "host", "?"))
    try:
        core = k8s.CoreV1Api(api)
        node_kw = {"label_selector": node_selector} if node_selector else {}
        raw_nodes = await _list_all(core.list_node, **node_kw)
        raw_pods: list[dict[str, Any]] = []
        if namespaces:
            for ns in namespaces:
                raw_pods.extend(await _list_all(core.list_namespaced_pod, namespace=ns))
        else:
            raw_pods = await _list_all(core.list_pod_for_all_namespaces)
    except ApiError as exc:
        raise InvalidInputError(f"the API server at {server} refused the listing: {exc}") from exc
    except (TimeoutError, OSError, aiohttp.ClientError) as exc:
        raise InvalidInputError(f"cannot reach the API server at {server}: {exc or type(exc).__name__}") from exc
    finally:
        await api.close()
    now = time.time()
    nodes, control = nodes_from_k8s(raw_nodes, groups)
    pods, excluded = pods_from_k8s(
        raw_pods, defaults, classes, namespaces, {n.name for n in nodes} if node_selector else None
    )
    notes: list[str] = []
    if control:
        notes.append(f"{control} control-plane node(s) left out of the bill and the replay")
    own: float | None = None
    if prometheus_url:
        window = max(60, math.ceil(since_seconds))
        step = max(15, window // 500)
        try:
            docs = await _prometheus(prometheus_url, PromQueries(window, step).all(), now)
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise InvalidInputError(
                f"cannot reach Prometheus at {prometheus_url}: {exc or type(exc).__name__}"
            ) from exc
        p_nodes, p_pods, p_notes, own = from_prometheus(
            docs,
            known_nodes={n.name for n in nodes},
            known_pods={p.key for p in pods},
            now=now,
            step=step,
            groups=groups,
            defaults=defaults,
            classes=classes,
            namespaces=namespaces,
        )
        if node_selector and p_nodes:
            p_nodes = []  # kube-state-metrics keeps only allowlisted labels: a deleted node's selector is unknown
            p_notes.append("--node-selector: deleted nodes from Prometheus left out (their labels are not known)")
        nodes.extend(p_nodes)
        pods.extend(p_pods)
        notes.extend(p_notes)
        if own is not None and (node_selector or namespaces):
            notes.append("the sidecar's cost gauge covers the whole cluster, not only the selected nodes / namespaces")
    return ClusterHistory(
        now=now,
        nodes=tuple(nodes),
        pods=tuple(pods),
        prometheus=bool(prometheus_url),
        notes=tuple(notes),
        excluded_pods=excluded,
        own_cost_usd=own,
    )
