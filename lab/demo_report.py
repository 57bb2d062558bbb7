"""`make demo`'s report, built from what the demo observed: pure functions over plain dicts, no cluster.

lab/demo.py drives a kind cluster and collects raw objects (pods, nodes, Events, Prometheus answers, the
migration's record and the counter's log lines); this module turns them into a ``Report``, says which of the
demo's claims failed (``failures``: `make demo` exits non-zero on any), renders the text and writes the plot.
Kept apart so the tests (tests/test_demo_report.py) exercise every part of the report without a cluster: a
regression in parsing the controller's Events or the plot fails there, not first in CI's `make demo`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from extender.core.model import cpu_millicores, memory_bytes

__all__ = [
    "CLASSES",
    "ClassRow",
    "Migration",
    "NodeRow",
    "PodRow",
    "Preemption",
    "Purchase",
    "Report",
    "VerbRow",
    "build_report",
    "failures",
    "parse_release",
    "parse_ticks",
    "release_order",
    "render",
    "rfc3339",
    "write_plot",
]

PREFIX = "qos.kube-qos-extender.io/"
GROUP_LABEL = PREFIX + "node-group"
FLAVOUR_LABEL = "node.kubernetes.io/instance-type"
PRICE_ANNOTATION = PREFIX + "price-per-hour"
PROVISIONED_BY = PREFIX + "provisioned-by"
CLASSES = ("gold", "silver", "bronze")
# the controller's QoSReleased Event (extender/controller/loop.py): "... pinned to NODE: Q=-2.6s after 0.6s", and its
# QoSReleasedForPriority Event: "no room by the QoS rules (Q=597.3s after 12.0s), but ..." (unpinned)
FOR_PRIORITY = "QoSReleasedForPriority"
RELEASE_REASONS = ("QoSReleased", FOR_PRIORITY)
_RELEASED = re.compile(r"(?:pinned to (?P<node>\S+): )?Q=(?P<q>-?[\d.]+|-?inf)s after (?P<waited>[\d.]+)s")
_TICK = re.compile(r"^(\S+) tick (\d+)$")
NAME_LABEL = "qos-demo/name"  # lab/demo.py's label on every pod of the workload: its name in the demo
_SCHED_PREEMPTED = re.compile(r"Preempted by pod (?P<uid>\S+) on node (?P<node>\S+)")
_QOS_PREEMPTED = re.compile(r"evicted for (?:\S+/)?(?P<pod>\S+) on (?P<node>\S+?):")


def rfc3339(stamp: str) -> float:
    """Unix seconds of an API timestamp (``2026-11-22T20:01:02Z``, or a kubelet log's nanosecond fraction:
    Python's parser takes at most microseconds, so the fraction is added by hand)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", stamp)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    return datetime.fromisoformat(m.group(1) + "+00:00").timestamp() + float(m.group(2) or 0)


def parse_ticks(text: str) -> list[tuple[float, int]]:
    """(timestamp, count) of each ``tick N`` line of a ``timestamps=true`` container log; other lines skipped."""
    return [(rfc3339(m.group(1)), int(m.group(2))) for line in text.splitlines() if (m := _TICK.match(line.strip()))]


def parse_release(message: str) -> tuple[float, float, str | None] | None:
    """(Q, seconds waited behind the gate, pinned node) of a release Event's message (RELEASE_REASONS), None if it
    is not one."""
    m = _RELEASED.search(message)
    if not m:
        return None
    return float(m.group("q")), float(m.group("waited")), m.group("node")


# ---------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class PodRow:
    name: str
    label: str  # the demo's name for it (a Deployment's pods have generated names)
    cls: str
    kind: str
    cpu_m: int
    memory: int
    node: str | None
    phase: str
    created: float | None
    q: float | None = None  # at release (the controller's Event)
    waited: float | None = None  # seconds behind the ordering gate (the controller's Event)
    running_at: float | None = None  # first seen Running by the demo (seconds after submission)
    released_rank: int | None = None  # 1 = released first
    released_pass: int | None = None  # 1 = the controller's first pass that released some of the demo's pods
    migrated_from: str | None = None  # the source pod's name, for a pod the migration made
    for_priority: bool = False  # released unpinned to kube-scheduler's priority preemption (QoSReleasedForPriority)


@dataclass(frozen=True)
class NodeRow:
    name: str
    group: str
    flavour: str
    type: str  # kind (a real kind worker), kwok (faked by kwok), control-plane
    price: float
    bought: bool  # by the autoscaler (provisioned-by label)
    created: float | None
    cpu_alloc_m: int
    pods: tuple[str, ...] = ()  # the demo's pods on it
    cpu_used_m: int = 0  # requested by every pod on it (the demo's and the cluster's)


@dataclass(frozen=True)
class Purchase:
    node: str
    group: str
    flavour: str
    price: float
    after: float | None  # seconds after the workload was submitted
    pods: tuple[str, ...]


@dataclass(frozen=True)
class Preemption:
    victim: str  # the demo's name of the evicted pod
    by: str  # the demo's name of the pod it made room for ("?" when not known)
    node: str
    who: str  # kube-scheduler (priority preemption) or the QoS controller (same priority, by Q)
    detail: str = ""


@dataclass(frozen=True)
class VerbRow:
    verb: str
    requests: float
    mean_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class ClassRow:
    cls: str
    slo: float | None
    pods: int
    waited_mean: float | None  # behind the gate (Events)
    waited_max: float | None
    running_mean: float | None  # submission -> Running (the demo's polls)
    fulfilment: float | None  # share of live requests at or above the SLO (the controller's metric)
    availability: float | None  # mean e / (e + p) of live requests (the controller's metric)


@dataclass(frozen=True)
class Migration:
    pod: str
    source: str
    destination: str
    destination_pod: str
    outcome: str
    reason: str
    seconds: float
    ticks_source: tuple[tuple[float, int], ...]  # the source's log before the move
    ticks_destination: tuple[tuple[float, int], ...]  # the destination's log (the source's carried over, then new)
    committed: float | None  # the agents' commit time (unix seconds)
    phases: tuple[tuple[str, float], ...] = ()

    @property
    def last_source_tick(self) -> int | None:
        return self.ticks_source[-1][1] if self.ticks_source else None

    @property
    def restored(self) -> list[tuple[float, int]]:
        """The ticks the restored process printed on the destination (after the commit)."""
        if self.committed is None:
            return []
        return [(t, n) for t, n in self.ticks_destination if t > self.committed]

    @property
    def first_restored_tick(self) -> int | None:
        r = self.restored
        return r[0][1] if r else None

    @property
    def progress_kept(self) -> bool:
        """The counter went on from where the source was: the restored process's first tick is after the last
        one the source printed before the move started (a restart would print 0), and it counts on by one."""
        first, last = self.first_restored_tick, self.last_source_tick
        if first is None or last is None:
            return False
        counts = [n for _, n in self.restored]
        return first > last and counts == list(range(first, first + len(counts)))


@dataclass
class Report:
    t0: float  # when the workload was submitted (unix seconds)
    pods: list[PodRow]
    nodes: list[NodeRow]
    purchases: list[Purchase]
    verbs: list[VerbRow]
    classes: list[ClassRow]
    migration: Migration | None
    preemptions: list[Preemption] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # demo names with no pod Running at the end
    # of ``missing``: pods kube-scheduler's priority preemption deleted and nothing re-created (bare pods)
    preempted_gone: list[str] = field(default_factory=list)
    releases_by_reason: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    simulator: str | None = None

    def to_json(self) -> str:
        doc = asdict(self)
        if self.migration is not None:
            doc["migration"]["progress_kept"] = self.migration.progress_kept
            doc["migration"]["first_restored_tick"] = self.migration.first_restored_tick
        return json.dumps(doc, indent=1, sort_keys=True, default=str)

    @property
    def cost_before(self) -> float:
        return sum(n.price for n in self.nodes if not n.bought and n.type != "control-plane")

    @property
    def cost_after(self) -> float:
        return sum(n.price for n in self.nodes if n.type != "control-plane")


# ---------------------------------------------------------------------------------------------- building


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    cpu = mem = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        req = (c.get("resources") or {}).get("requests") or {}
        cpu += cpu_millicores(str(req.get("cpu", "0")))
        mem += memory_bytes(str(req.get("memory", "0")))
    return cpu, mem


def _created(obj: Mapping[str, Any]) -> float | None:
    stamp = _meta(obj).get("creationTimestamp")
    return rfc3339(stamp) if isinstance(stamp, str) else None


def _node_row(node: Mapping[str, Any], all_pods: Iterable[Mapping[str, Any]], ours: Iterable[str]) -> NodeRow:
    meta = _meta(node)
    labels = meta.get("labels") or {}
    name = str(meta.get("name"))
    control_plane = "node-role.kubernetes.io/control-plane" in labels
    kind = "control-plane" if control_plane else str(labels.get("type", "-"))
    try:
        price = float((meta.get("annotations") or {}).get(PRICE_ANNOTATION, 0) or 0)
    except ValueError:
        price = 0.0
    used = sum(_requests(p)[0] for p in all_pods if (p.get("spec") or {}).get("nodeName") == name)
    alloc = cpu_millicores(str(((node.get("status") or {}).get("allocatable") or {}).get("cpu", "0")))
    return NodeRow(
        name=name,
        group=str(labels.get(GROUP_LABEL, "-")),
        flavour=str(labels.get(FLAVOUR_LABEL, "-")),
        type=kind,
        price=price,
        bought=bool(labels.get(PROVISIONED_BY)),
        created=_created(node),
        cpu_alloc_m=alloc,
        pods=tuple(sorted(ours)),
        cpu_used_m=used,
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def release_order(rows: Sequence[PodRow], gap: float = 2.0) -> tuple[dict[str, int], dict[str, int]]:
    """(pod -> rank, pod -> pass) of the released pods. Every pod of the demo was submitted at once, so each was
    released ``waited`` seconds after submission (the controller measures the wait from the pod's creation; the
    Events' own times have a second's resolution, too coarse to order by). Releases less than ``gap`` seconds
    apart are one pass of the controller, which releases in increasing Q: within a pass, by Q."""
    done = sorted((r for r in rows if r.waited is not None), key=lambda r: r.waited or 0.0)
    passes: dict[str, int] = {}
    current, last = 0, None
    for r in done:
        if last is None or (r.waited or 0.0) - last > gap:
            current += 1
        passes[r.name] = current
        last = r.waited or 0.0
    order = sorted(done, key=lambda r: (passes[r.name], r.q if r.q is not None else 0.0, r.name))
    return {r.name: i + 1 for i, r in enumerate(order)}, passes


def build_report(
    *,
    t0: float,
    workload: Sequence[Mapping[str, Any]],
    all_pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    running_at: Mapping[str, float],
    names: Mapping[str, str] | None = None,
    uids: Mapping[str, str] | None = None,
    expected: Sequence[str] = (),
    verbs: Sequence[VerbRow] = (),
    class_metrics: Mapping[str, Mapping[str, float]] | None = None,
    slo: Mapping[str, float] | None = None,
    releases_by_reason: Mapping[str, float] | None = None,
    migration: Migration | None = None,
    timings: Mapping[str, float] | None = None,
    bare: Iterable[str] = (),
) -> Report:
    """The report from the demo's observations. ``workload``: the demo's pods as the API has them at the end (a
    migrated pod under its destination name); ``all_pods``: every pod of the cluster (what fills the nodes);
    ``events``: the demo namespace's Events; ``running_at``: pod name -> seconds after ``t0`` it was first seen
    Running; ``names`` / ``uids``: pod name -> demo name and uid -> pod name of every pod seen during the run
    (preempted ones are gone by the end); ``expected``: the demo names that must each have a Running pod;
    ``class_metrics``: class -> {fulfilment, availability} from the controller's metrics; ``bare``: the demo names
    whose pods have no owner (nothing re-creates them once deleted)."""
    names = dict(names or {})
    uids = dict(uids or {})
    for p in workload:
        meta = _meta(p)
        label = (meta.get("labels") or {}).get(NAME_LABEL)
        names.setdefault(str(meta.get("name")), str(label or meta.get("name")))
    released: dict[str, tuple[float, float, str | None, float, bool]] = {}
    for e in events:
        if e.get("reason") not in RELEASE_REASONS:
            continue
        parsed = parse_release(str(e.get("message", "")))
        name = (e.get("involvedObject") or {}).get("name")
        if parsed is None or not isinstance(name, str):
            continue
        stamp = e.get("firstTimestamp") or e.get("eventTime") or ""
        at = rfc3339(stamp) if isinstance(stamp, str) and stamp else 0.0
        if name not in released or at >= released[name][3]:  # a re-queued pod: its last release counts
            released[name] = (*parsed, at, e.get("reason") == FOR_PRIORITY)
    rows: list[PodRow] = []
    for p in workload:
        meta = _meta(p)
        ann = meta.get("annotations") or {}
        name = str(meta.get("name"))
        source = str(ann.get(PREFIX + "migrated-from", "")).split("/")[-1]
        origin = source or name
        cpu, mem = _requests(p)
        rel = released.get(origin) or released.get(name)
        rows.append(
            PodRow(
                name=name,
                label=names.get(name, name),
                cls=str(ann.get(PREFIX + "class", "-")),
                kind=str(ann.get(PREFIX + "kind", "service")),
                cpu_m=cpu,
                memory=mem,
                node=(p.get("spec") or {}).get("nodeName"),
                phase=str((p.get("status") or {}).get("phase", "Pending")),
                created=_created(p),
                q=rel[0] if rel else None,
                waited=rel[1] if rel else None,
                running_at=running_at.get(origin, running_at.get(name)),
                migrated_from=source or None,
                for_priority=rel[4] if rel else False,
            )
        )
    rank, passes = release_order(rows)
    rows = [
        PodRow(**{**asdict(r), "released_rank": rank.get(r.name), "released_pass": passes.get(r.name)}) for r in rows
    ]
    on_node: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r.node:
            on_node[r.node].append(_label(r))
    node_rows = sorted(
        (_node_row(n, all_pods, on_node.get(str(_meta(n).get("name")), [])) for n in nodes),
        key=lambda n: (n.type == "control-plane", n.bought, n.group, n.name),
    )
    purchases = [
        Purchase(n.name, n.group, n.flavour, n.price, None if n.created is None else n.created - t0, n.pods)
        for n in node_rows
        if n.bought
    ]
    metrics = class_metrics or {}
    classes: list[ClassRow] = []
    for cls in CLASSES:
        mine = [r for r in rows if r.cls == cls]
        if not mine:
            continue
        waits = [r.waited for r in mine if r.waited is not None]
        runs = [r.running_at for r in mine if r.running_at is not None]
        m = metrics.get(cls, {})
        classes.append(
            ClassRow(
                cls=cls,
                slo=(slo or {}).get(cls),
                pods=len(mine),
                waited_mean=_mean(waits),
                waited_max=max(waits) if waits else None,
                running_mean=_mean(runs),
                fulfilment=m.get("fulfilment"),
                availability=m.get("availability"),
            )
        )
    preemptions = preemptions_in(events, names, uids)
    running = {r.label for r in rows if r.phase == "Running"}
    missing = sorted(set(expected) - running)
    present = {r.label for r in rows}
    return Report(
        t0=t0,
        pods=rows,
        preemptions=preemptions,
        missing=missing,
        preempted_gone=gone_by_preemption(set(missing) & set(bare), present, preemptions),
        nodes=node_rows,
        purchases=purchases,
        verbs=list(verbs),
        classes=classes,
        migration=migration,
        releases_by_reason=dict(releases_by_reason or {}),
        timings=dict(timings or {}),
    )


SCHEDULER_PRIORITY = "kube-scheduler (priority)"


def preemptions_in(
    events: Iterable[Mapping[str, Any]], names: Mapping[str, str], uids: Mapping[str, str]
) -> list[Preemption]:
    """The preemptions the namespace's Events record, by kube-scheduler (priority) or the QoS controller (Q),
    named with the demo's names (``names``: pod name -> demo name; ``uids``: uid -> pod name)."""
    out: list[Preemption] = []
    for e in events:
        victim = str((e.get("involvedObject") or {}).get("name", ""))
        message = str(e.get("message", ""))
        if e.get("reason") == "Preempted" and (hit := _SCHED_PREEMPTED.search(message)):
            by = uids.get(hit.group("uid"))
            out.append(
                Preemption(names.get(victim, victim), names.get(by, by) if by else "a pod outside the demo",
                           hit.group("node"), SCHEDULER_PRIORITY)
            )  # fmt: skip
        elif e.get("reason") == "QoSPreempted" and (hit := _QOS_PREEMPTED.search(message)):
            by = hit.group("pod")
            detail = message.split(": ", 1)[-1]
            out.append(
                Preemption(names.get(victim, victim), names.get(by, by), hit.group("node"), "QoS controller", detail)
            )
    return out


def gone_by_preemption(missing: Iterable[str], present: Iterable[str], preemptions: Iterable[Preemption]) -> list[str]:
    """Of ``missing`` (bare pods' demo names with no pod Running), those with no pod left at all that
    kube-scheduler's priority preemption deleted: a bare pod (the demo's batch pods) has no owner to re-create
    it, so it is gone by design, not stuck."""
    victims = {x.victim for x in preemptions if x.who == SCHEDULER_PRIORITY}
    left = set(present)
    return sorted(n for n in missing if n in victims and n not in left)


# ---------------------------------------------------------------------------------------------- checks


def failures(report: Report) -> list[str]:
    """What the demo set out to show and did not: `make demo` fails on any (CI runs it)."""
    out: list[str] = []
    pending = sorted(
        ({p.label for p in report.pods if p.phase != "Running"} | set(report.missing)) - set(report.preempted_gone)
    )
    if pending:
        out.append(f"pods not Running at the end: {', '.join(pending)}")
    if not report.purchases:
        out.append("the autoscaler bought no node for the pods that did not fit")
    elif len({p.flavour for p in report.purchases}) < 2:
        out.append(f"the autoscaler bought one flavour only ({report.purchases[0].flavour}), not a mix")
    released = [p for p in report.pods if p.waited is not None]
    if not released:
        out.append("no QoSReleased Event: the QoS controller released nothing")
    else:
        waits = {c.cls: c.waited_mean for c in report.classes if c.waited_mean is not None}
        if "gold" in waits and "bronze" in waits and waits["gold"] > waits["bronze"]:
            out.append(f"gold waited longer than bronze ({waits['gold']:.1f} s > {waits['bronze']:.1f} s)")
    m = report.migration
    if m is None:
        out.append("no migration was attempted")
    elif m.outcome != "succeeded":
        out.append(f"the migration of {m.pod} ended {m.outcome}: {m.reason}")
    elif not m.progress_kept:
        out.append(
            f"the migrated counter did not go on from tick {m.last_source_tick} "
            f"(first tick on the destination: {m.first_restored_tick})"
        )
    verbs = {v.verb: v.requests for v in report.verbs}
    for verb in ("filter", "bind"):
        if not verbs.get(verb):
            out.append(f"Prometheus has no {verb} request of the in-cluster extender")
    return out


# ---------------------------------------------------------------------------------------------- text


def _s(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _label(p: PodRow) -> str:
    return f"{p.label}*" if p.migrated_from else p.label


def render(report: Report) -> list[str]:
    """The report as text lines (what `make demo` prints)."""
    lines: list[str] = []
    say = lines.append
    say("== QoS ordering: each pass of the controller released the gated pods in increasing Q (time to violate)")
    say(f"{'#':>3} {'pass':>4} {'pod':<31} {'class':<7} {'kind':<8} {'Q s':>8} {'gated s':>8} {'Running s':>9}  node")
    for p in sorted(report.pods, key=lambda p: (p.released_rank or 10**6, p.name)):
        say(
            f"{_s(p.released_rank, '{:d}'):>3} {_s(p.released_pass, '{:d}'):>4} {_label(p) + '^' * p.for_priority:<31} "
            f"{p.cls:<7} {p.kind:<8} {_s(p.q):>8} {_s(p.waited):>8} {_s(p.running_at):>9}  {p.node or '-'}"
        )
    if any(p.for_priority for p in report.pods):
        say("^ no room by the QoS rules: released unpinned to kube-scheduler's priority preemption")
    say("")
    say("== per class: gate wait (controller Events), submission -> Running (demo), SLO (controller metrics:")
    say("   availability so far = time running / time since submission: a minute into the run, the wait for room")
    say("   or for a bought node weighs heavily; the SLO is judged over a request's whole life)")
    head = ("class", "SLO", "pods", "gated mean/max s", "Running mean s", "avail", "at SLO")
    say(f"{head[0]:<7} {head[1]:>4} {head[2]:>4} {head[3]:>17} {head[4]:>15} {head[5]:>6} {head[6]:>7}")
    for c in report.classes:
        say(
            f"{c.cls:<7} {_s(c.slo, '{:.2f}'):>4} {c.pods:>4} {_s(c.waited_mean) + ' / ' + _s(c.waited_max):>17} "
            f"{_s(c.running_mean):>15} {_s(c.availability, '{:.3f}'):>6} {_s(c.fulfilment, '{:.0%}'):>7}"
        )
    if report.releases_by_reason:
        reasons = ", ".join(f"{k} {v:.0f}" for k, v in sorted(report.releases_by_reason.items()))
        say(f"releases by reason: {reasons}")
    for x in report.preemptions:
        say(f"preempted: {x.victim} on {x.node} for {x.by}, by {x.who}{' (' + x.detail + ')' if x.detail else ''}")
    if report.preemptions:
        say("(a preempted service's ReplicaSet makes a new pod: gated again, ordered, bought for if nothing fits)")
    for name in report.preempted_gone:
        say(f"({name}: a bare pod preempted by kube-scheduler is deleted and nothing re-creates it; a Job would)")
    say("")
    say("== placement by node group and flavour (cpu requested by every pod / allocatable)")
    say(f"{'node':<32} {'type':<13} {'group':<8} {'flavour':<10} {'$/h':>7} {'cpu':>10}  demo pods")
    for n in report.nodes:
        tag = "kwok, bought" if n.bought else n.type
        cpu = f"{n.cpu_used_m / 1000:.2f}/{n.cpu_alloc_m / 1000:.2f}"
        say(f"{n.name:<32} {tag:<13} {n.group:<8} {n.flavour:<10} {n.price:>7.4f} {cpu:>10}  {', '.join(n.pods)}")
    say("")
    say("== the autoscaler's purchases (kwok provider: the lab's stand-in for a cloud)")
    if not report.purchases:
        say("  none")
    for b in report.purchases:
        say(
            f"  +{_s(b.after, '{:.0f}')} s  {b.node:<32} {b.group:<8} {b.flavour:<10} ${b.price:.4f}/h  "
            f"now holds {', '.join(b.pods) or 'nothing'}"
        )
    flavours = sorted({b.flavour for b in report.purchases})
    say(
        f"cost per hour: ${report.cost_before:.4f} (the kind workers) -> ${report.cost_after:.4f} "
        f"({len(report.purchases)} nodes bought, flavours {', '.join(flavours) or '-'})"
    )
    say("")
    say("== migration: one batch pod moved by checkpoint/restore through the node agents")
    m = report.migration
    if m is None:
        say("  none")
    else:
        say(f"  {m.pod}: {m.source} -> {m.destination} as {m.destination_pod}: {m.outcome} in {m.seconds:.1f} s")
        if m.reason:
            say(f"  ({m.reason})")
        if m.phases:
            first = m.phases[0][1]
            say("  agents: " + ", ".join(f"{p} +{t - first:.2f}s" for p, t in m.phases))
        say(
            f"  counter: the source printed up to tick {_s(m.last_source_tick, '{:d}')} before the move; the "
            f"restored process went on at tick {_s(m.first_restored_tick, '{:d}')} "
            f"({'progress kept' if m.progress_kept else 'PROGRESS LOST'})"
        )
    say("")
    say("== extender verbs (Prometheus, job kube-qos-extender-in-cluster)")
    say(f"{'verb':<11} {'requests':>8} {'mean ms':>8} {'p99 ms':>8}")
    for v in report.verbs:
        say(f"{v.verb:<11} {v.requests:>8.0f} {_s(v.mean_ms, '{:.2f}'):>8} {_s(v.p99_ms, '{:.1f}'):>8}")
    say("(each released pod is pinned to the host the controller chose: one feasible node, which kube-scheduler")
    say(" does not score, so prioritize is seldom called; preempt only when kube-scheduler preempts by priority)")
    if report.timings:
        say("")
        say("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in report.timings.items()))
    return lines


# ---------------------------------------------------------------------------------------------- plot

_COLOURS = {"gold": "#d4a017", "silver": "#8c8c8c", "bronze": "#a0522d", "-": "#4477aa"}


def write_plot(report: Report, path: Path) -> Path:
    """Four panels in one PNG: release order and waits per pod, placement per node, cost per hour over the run,
    the migrated counter's ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    (ax_q, ax_nodes), (ax_cost, ax_mig) = axes

    # 1. QoS ordering: each pod's wait behind the gate, then its run, in release order
    ordered = sorted(report.pods, key=lambda p: (p.released_rank or 10**6, p.name))
    for i, p in enumerate(ordered):
        colour = _COLOURS.get(p.cls, _COLOURS["-"])
        gated = p.waited or 0.0  # every pod was submitted at 0
        ax_q.barh(i, gated, left=0.0, color=colour, alpha=0.35, hatch="//", edgecolor=colour)
        if p.running_at is not None:
            ax_q.plot([p.running_at], [i], marker="o", color=colour)
    ax_q.set_yticks(range(len(ordered)), [f"{_label(p)} [{p.kind}]" for p in ordered], fontsize=7)
    ax_q.invert_yaxis()
    ax_q.set_xlabel("seconds after submission (bar: held by the ordering gate; dot: Running; *: migrated)")
    ax_q.set_title("QoS ordering: release order by Q")
    for cls in CLASSES:
        ax_q.bar([0], [0], color=_COLOURS[cls], label=cls)
    ax_q.legend(loc="center right", fontsize=8)

    # 2. placement: the demo's cpu per node by class, the rest of each node's requests in grey
    nodes = [n for n in report.nodes if n.type != "control-plane"]
    by_node_cls: dict[tuple[str, str], int] = defaultdict(int)
    for p in report.pods:
        if p.node:
            by_node_cls[(p.node, p.cls)] += p.cpu_m
    xs = range(len(nodes))
    bottom = [0.0] * len(nodes)
    for cls in CLASSES:
        vals = [by_node_cls.get((n.name, cls), 0) / 1000 for n in nodes]
        ax_nodes.bar(xs, vals, bottom=bottom, color=_COLOURS[cls], label=cls)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    other = [max(0.0, n.cpu_used_m / 1000 - b) for n, b in zip(nodes, bottom, strict=True)]
    ax_nodes.bar(xs, other, bottom=bottom, color="#cccccc", label="other pods")
    ax_nodes.scatter(xs, [n.cpu_alloc_m / 1000 for n in nodes], marker="_", s=400, color="black", label="allocatable")
    ax_nodes.set_xticks(
        list(xs),
        [f"{n.group}\n{n.flavour}\n{'bought' if n.bought else n.type}\n\\${n.price:.3f}/h" for n in nodes],
        fontsize=7,
    )
    ax_nodes.set_ylabel("cpu (cores) requested")
    ax_nodes.set_title("placement by node group and flavour")
    ax_nodes.legend(fontsize=8)

    # 3. cost per hour over the run: the kind workers, then each node the autoscaler bought
    steps = sorted((b.after or 0.0, b.price, b.flavour) for b in report.purchases)
    end = max([p.running_at or 0.0 for p in report.pods] + [s[0] for s in steps] + [1.0]) * 1.1
    t, cost = [0.0], [report.cost_before]
    for at, price, flavour in steps:
        t.append(at)
        cost.append(cost[-1])
        t.append(at)
        cost.append(cost[-1] + price)
        ax_cost.annotate(flavour, (at, cost[-1]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    t.append(end)
    cost.append(cost[-1])
    ax_cost.plot(t, cost, color="#4477aa")
    ax_cost.set_xlabel("seconds after submission")
    ax_cost.set_ylabel("\\$ per hour")
    ax_cost.set_title(  # (a bare $ starts matplotlib's mathtext)
        f"autoscaler: {len(steps)} nodes bought, \\${report.cost_before:.3f} to \\${report.cost_after:.3f} per hour"
    )

    # 4. migration: the counter's ticks on the source, then the restored process's on the destination
    m = report.migration
    if m is not None and m.ticks_source:
        shown = m.ticks_source[-20:]  # the seconds around the move, not the whole run
        base = shown[0][0]
        ax_mig.plot([t - base for t, _ in shown], [n for _, n in shown], "o", label=f"source {m.source}")
        restored = m.restored
        if restored:
            ax_mig.plot(
                [t - base for t, _ in restored], [n for _, n in restored], "o", label=f"restored {m.destination}"
            )
        if m.committed is not None:
            ax_mig.axvline(m.committed - base, color="grey", linestyle="--", label="committed")
        ax_mig.legend(fontsize=8)
        ax_mig.set_title(f"migration of {m.pod}: {m.outcome}, progress {'kept' if m.progress_kept else 'LOST'}")
    else:
        ax_mig.set_title("migration: none")
    ax_mig.set_xlabel("seconds (the last 20 ticks before the move, then the destination's own)")
    ax_mig.set_ylabel("counter tick")

    fig.suptitle("make demo: kube-qos-extender on kind")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
