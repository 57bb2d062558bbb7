"""The simulator's `product` policy and the autoscaler sidecar buy alike under a binding node cap (issue 14).

Both call ``extender.core.autoscale_scan.scan`` with two limits, ``budget`` (max_nodes_per_cycle) and ``cap``
(max_nodes minus the nodes owned and on order): the simulator from its own state (``Simulator._product_scan``),
the sidecar from the cluster (``AutoscalerLoop.step``). This test replays an HTAS workload under `product` with
``max_nodes`` so small that the planner must re-plan with larger flavours, and at every scan writes the
simulator's state as the objects the sidecar lists: nodes (ours labelled provisioned-by, the workload's initial
nodes not), bound pods, pending pods held by the QoS controller's scheduling gate since they became pending
(so the sidecar's ``GATED_DEMAND_SECONDS`` and the waits the SLO trigger reads are the simulator's), the nodes
being provisioned as the ledger and the measured lags. It requires the same nodes bought (group, flavour, pods,
in order) and the same idle nodes deleted, and that the cap re-shaped some purchases (not vacuous). It fails if
either side computes its limits differently or grows a decision of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from extender.autoscaler.loop import PROVISIONED_BY_LABEL, PROVISIONED_BY_VALUE, RETIRING_LABEL, AutoscalerLoop
from extender.autoscaler.view import AutoscalerSnapshot
from extender.core import autoscale
from extender.core.model import NodeGroup, WorkloadKind
from extender.kube.convert import CLASS_KEY, KIND_KEY, RUNTIME_KEY
from extender.settings.extender import ExtenderConfig
from extender.sim import engine
from extender.sim.engine import SimConfig, Simulator, State
from extender.sim.product import ProductSettings
from extender.sim.workloads import htas
from tests.autoscaler_settings import make_settings

CONFIG = ExtenderConfig()
SCHEDULER = "qos-scheduler"
GATE = CONFIG.controller.gate_name


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sidecar(sim: Simulator) -> AutoscalerLoop:
    """The sidecar with the product's settings (the simulator's ``ProductSettings``, as config/ ships them)."""
    p = sim.prod
    settings = make_settings(
        scheduler_names=(SCHEDULER,),
        flavours=tuple(sim.w.flavours),
        weights=p.weights,
        batch_cycle_seconds=p.batch_cycle_seconds,
        idle_seconds=p.idle_seconds,
        provisioning_timeout_seconds=p.provisioning_timeout_seconds,
        underutil_threshold=p.underutil_threshold,
        underutil_sustain_seconds=p.underutil_sustain_seconds,
        batch_queue_quiet_seconds=p.batch_queue_quiet_seconds,
        lag_default_seconds=p.lag_default_seconds,
        lag_window=p.lag_window,
        lag_quantile=p.lag_quantile,
        max_nodes_per_cycle=p.max_nodes_per_cycle,
        max_nodes=p.max_nodes,
        retire_drain_seconds=p.retire_drain_seconds,
        max_attempts_per_pod=10**6,
        scale_down_provisioned_only=p.scale_down_provisioned_only,
    )
    names = iter(range(10**9))
    slo = {name: c.slo for name, c in p.classes.items()}
    return AutoscalerLoop(settings, CONFIG.node_groups, name_suffix=lambda: f"{next(names):06d}", slo=slo)


def _pod_json(sim: Simulator, r: engine.Req) -> dict[str, Any]:
    pod = sim._pod(r)
    annotations = {KIND_KEY: pod.kind.value, CLASS_KEY: pod.class_name}
    if pod.kind is WorkloadKind.BATCH:
        # the work left now, as a run starting now: the remaining runtime every core decision reads
        annotations[RUNTIME_KEY] = repr(pod.remaining_runtime(sim.now))
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "nodeName": r.node,
        "containers": [
            {
                "name": "c",
                "resources": {
                    "requests": {"cpu": f"{pod.requests.cpu_milli}m", "memory": str(pod.requests.memory_bytes)}
                },
            }
        ],
    }
    status: dict[str, Any] = {"phase": "Running" if r.node else "Pending"}
    if r.node is None:
        spec["schedulingGates"] = [{"name": GATE}]  # every pending product pod is held by the QoS controller
    else:
        status["startTime"] = _stamp(sim.now)
    meta = {"name": pod.name, "namespace": "default", "uid": pod.uid, "annotations": annotations}
    return {"metadata": meta, "spec": spec, "status": status}


def _cluster(sim: Simulator) -> AutoscalerSnapshot:
    now = sim.now
    nodes = []
    for n in sim.nodes.values():
        alloc = n.allocatable
        res = {"cpu": f"{alloc.cpu_milli}m", "memory": str(alloc.memory_bytes), "pods": str(alloc.pods)}
        labels = {
            "qos.kube-qos-extender.io/node-group": n.group.value,
            CONFIG.node_groups.flavour_label: n.flavour or "host",
        }
        if n.owned:
            labels[PROVISIONED_BY_LABEL] = PROVISIONED_BY_VALUE
        if n.name in sim.scan_state.retiring:  # the sidecar's record of a node it retired (cordon + label)
            labels[RETIRING_LABEL] = "true"
        nodes.append(
            {
                "metadata": {"name": n.name, "labels": labels, "creationTimestamp": _stamp(n.ready_at)},
                "spec": {"unschedulable": True} if n.cordoned else {},
                "status": {"allocatable": res, "capacity": res},
            }
        )
    snap = AutoscalerSnapshot(CONFIG)
    snap.replace_nodes(nodes, "1", now=now)
    live = [r for r in sim.reqs.values() if r.state not in (State.WAITING, State.DONE)]
    snap.replace_pods([_pod_json(sim, r) for r in live if r.node is not None], "1", now=now)
    for r in live:
        if r.node is None:  # first seen gated when it became pending: the sidecar's gated_since is the sim's since
            snap.apply_pod("ADDED", _pod_json(sim, r), now=r.since)
    return snap


Bought = list[tuple[NodeGroup, str, tuple[str, ...]]]


@pytest.mark.parametrize("pattern", ["growing", "cycle"])
def test_every_product_scan_under_a_binding_cap_is_the_sidecars_decision(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = htas(pattern)
    cfg = SimConfig(product=ProductSettings(max_nodes=4, max_nodes_per_cycle=2))
    sidecar: dict[str, AutoscalerLoop] = {}
    original = Simulator._product_scan
    totals = {"scans": 0, "bought": 0, "reshaped": 0, "deleted": 0, "retired": 0}

    def checked_scan(self: Simulator) -> None:
        loop = sidecar.setdefault("loop", _sidecar(self))
        cluster = _cluster(self)
        entries = self.scan_state.provisioning
        loop.adopt_ledger(
            autoscale.ProvisioningLedger(tuple(e for _, e in entries)), {e.node_name: g for g, e in entries}
        )
        loop.lag_samples = list(self.lag_samples)
        loop.deleting = {self.flow_source: self.now} if self.flow_source else {}
        before_nodes, before_prov = set(self.nodes), set(self.provisioning)
        before_retiring = set(self.scan_state.retiring)
        original(self)
        ledger = {e.node_name: (g, e) for g, e in self.scan_state.provisioning}
        bought: Bought = [
            (ledger[name][0], ledger[name][1].flavour.name, ledger[name][1].pods)
            for name in self.provisioning
            if name not in before_prov
        ]
        deleted = sorted(before_nodes - set(self.nodes) - {self.flow_source})
        d = loop.step(cluster, self.now)
        expected: Bought = [(r.group, r.flavour.name, r.pods) for r in d.provision]
        assert (bought, deleted) == (expected, sorted(d.delete)), f"t={self.now}"
        retired = sorted(set(self.scan_state.retiring) - before_retiring)
        uncordoned = sorted((before_retiring - set(self.scan_state.retiring)) & set(self.nodes))
        assert (retired, uncordoned) == (sorted(d.retire), sorted(d.unretire)), f"t={self.now}"
        totals["scans"] += 1
        totals["bought"] += len(bought)
        totals["reshaped"] += sum(1 for plan in d.plans if plan.reshaped and plan.flavour_counts)
        totals["deleted"] += len(deleted)
        totals["retired"] += len(retired)

    monkeypatch.setattr(Simulator, "_product_scan", checked_scan)
    result = engine.simulate(w, "product", cfg)
    # not vacuous: both sides bought under the cap, re-shaped plans among them, and deleted idle nodes
    assert totals["scans"] > 100
    assert totals["bought"] == result.counters.nodes_added > 0
    assert totals["reshaped"] > 0 and totals["deleted"] > 0
    assert totals["retired"] > 0  # the cap also retired small nodes for larger ones, and both sides agreed
