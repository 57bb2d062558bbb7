"""The cluster as the extender sees it: Nodes and Pods from list+watch, plus our own not-yet-seen bindings.

Pure state, no I/O and no clock reads (time is an argument): the async list+watch runner that feeds it lives
in ``extender.kube.watch``, and tests drive it with recorded objects. Everything is converted to the core
model once, when an event arrives, so a verb only reads.

BindLedger: when we bind a pod, the watch shows it on its node a little later. Until then the ledger
"assumes" it there (kube-scheduler's cache does the same for its own bindings), so filter never offers the
same free space twice; the pod is confirmed when the watch shows it bound, forgotten when it is deleted, and
expired after a TTL if the watch never shows it (a bind that failed after all).

NodeTable: the per-node numbers filter and prioritize need (allocatable, requested incl. assumed pods, pod
count, cordon, node groups) as numpy columns, updated incrementally: a pod or ledger change marks its node
dirty, and the next verb refreshes only the dirty rows. A verb then costs one name -> row lookup per
candidate plus a few vector operations, instead of a Python loop over nodes.

RequestPods: kube-scheduler sends the same Pod to filter, prioritize, preempt; the parsed Pod is kept per
UID and resourceVersion, so a pod is converted once, and bind can assume a pod the watch has not shown yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from extender.core.model import InvalidInputError, Node, NodeGroup, Pod, Resources
from extender.core.slack import with_batch_resources
from extender.core.taints import Taint
from extender.kube.convert import (
    Problem,
    is_terminal,
    node_from_k8s,
    node_group_of,
    parse_timestamp,
    pod_from_k8s,
    pod_key,
    taints_of,
)
from extender.settings.sections import SnapshotSettings

__all__ = ["BindLedger", "LedgerEntry", "NodeEntry", "NodeTable", "PodEntry", "RequestPods", "Snapshot"]


# ------------------------------------------------------------------------------------------------ ledger


class LedgerEntry:
    """One assumed bind: ``source`` (the pod as the bind verb saw it) occupies ``node`` since ``assumed_at``.

    ``pod`` (the pod as bound: ``node_name`` and ``started_at`` set) is built at its first read. The bind verb
    makes one entry per pod and most are confirmed by the watch before any node view needs them, so the copy
    is made only where a view holds the pod; ``key`` and ``requests`` are the source's (the same either way).
    """

    __slots__ = ("_pod", "assumed_at", "node", "source")

    def __init__(self, source: Pod, node: str, assumed_at: float) -> None:
        self.source = source
        self.node = node
        self.assumed_at = assumed_at
        self._pod: Pod | None = None

    @property
    def key(self) -> str:
        return self.source.key

    @property
    def uid(self) -> str:
        return self.source.uid

    @property
    def pod(self) -> Pod:
        pod = self._pod
        if pod is None:
            pod = self._pod = self.source.bound_to(self.node, self.assumed_at)
        return pod

    def __repr__(self) -> str:
        return f"LedgerEntry({self.key!r} on {self.node!r} since {self.assumed_at!r})"


class BindLedger:
    """assume / confirm / expire of the pods we bound and the watch has not shown bound yet."""

    def __init__(self, ttl_seconds: float, on_change: Callable[[str], None] | None = None) -> None:
        if not ttl_seconds > 0:
            raise InvalidInputError(f"ledger TTL must be > 0, got {ttl_seconds!r}")
        self.ttl_seconds = ttl_seconds
        self._on_change = on_change
        self._entries: dict[str, LedgerEntry] = {}
        self._by_node: dict[str, dict[str, LedgerEntry]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> LedgerEntry | None:
        return self._entries.get(key)

    def assume(self, pod: Pod, node: str, now: float) -> LedgerEntry:
        """Record that ``pod`` now occupies ``node`` (replaces an earlier assumption for the same pod).

        ``now`` is checked here, not when the entry's bound pod is first built: a bad clock fails the bind."""
        if not math.isfinite(now):
            raise InvalidInputError(f"pod {pod.name}: start time must be finite")
        key = pod.key
        self.forget(key)
        entry = LedgerEntry(pod, node, now)
        self._entries[key] = entry
        self._by_node.setdefault(node, {})[key] = entry
        if self._on_change is not None:
            self._on_change(node)
        return entry

    def confirm(self, key: str) -> LedgerEntry | None:
        """The watch shows the pod bound (or gone): the snapshot accounts for it now."""
        return self.forget(key)

    def forget(self, key: str) -> LedgerEntry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            on_node = self._by_node.get(entry.node)
            if on_node is not None:
                on_node.pop(key, None)
                if not on_node:
                    del self._by_node[entry.node]
            if self._on_change is not None:
                self._on_change(entry.node)
        return entry

    def expire(self, now: float) -> list[LedgerEntry]:
        """Drop assumptions older than the TTL; returns them (each is a bind the watch never confirmed).

        Every filter call runs this, with up to a burst's worth of binds assumed (2,000 in issue 34's bench), so
        it stops at the first fresh entry instead of scanning them all: ``assume`` re-inserts at the end, so
        the entries are in the order they were assumed. A wall clock stepped back leaves a later entry with an
        earlier time behind a fresh one: it expires when those ahead of it do, a TTL late, never early."""
        stale: list[LedgerEntry] = []
        for e in self._entries.values():
            if now - e.assumed_at < self.ttl_seconds:
                break
            stale.append(e)
        for entry in stale:
            self.forget(entry.key)
        return stale

    def on_node(self, node: str) -> Iterable[LedgerEntry]:
        return self._by_node.get(node, {}).values()


# ------------------------------------------------------------------------------------------- node table

GROUP_BITS = {NodeGroup.BATCH: 1, NodeGroup.SERVICE: 2}

I64 = npt.NDArray[np.int64]


COLUMN_MAX = 2**62  # table values saturate here: a difference or sum of two stays inside int64


def saturate(value: int) -> int:
    """``value`` capped at :data:`COLUMN_MAX`: a node (or pod) declaring exabytes must not crash the int64
    columns (found by the watch fuzz test); no real quantity comes near 2**62 bytes or millicores."""
    return value if value < COLUMN_MAX else COLUMN_MAX


@dataclass(frozen=True, slots=True)
class RowIndex:
    """A candidate list's rows in the node table: ``rows`` (-1: unknown name), ``safe`` (rows with -1 as 0,
    for gathers), ``known`` (rows >= 0) and whether every name is known. Read-only arrays: it is shared by
    every call that sends the same list."""

    rows: I64
    safe: I64
    known: npt.NDArray[np.bool_]
    all_known: bool

    @staticmethod
    def of(rows: I64) -> RowIndex:
        known = rows >= 0
        all_known = bool(known.all())
        safe = rows if all_known else np.where(known, rows, 0)
        for a in (rows, safe, known):
            a.flags.writeable = False
        return RowIndex(rows, safe, known, all_known)


class NodeTable:
    """Per-node columns (one row per known node; rows of deleted nodes are reused) for vectorised verbs."""

    COLUMNS = ("alloc_cpu", "alloc_mem", "alloc_pods", "used_cpu", "used_mem", "used_pods", "groups")
    # Extended resources are not columns: a pod requesting one takes the per-node path (filter_nodes).

    def __init__(self) -> None:
        self.row: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._size = 0
        cap = 64
        self.alloc_cpu: I64 = np.zeros(cap, np.int64)
        self.alloc_mem: I64 = np.zeros(cap, np.int64)
        self.alloc_pods: I64 = np.zeros(cap, np.int64)
        self.used_cpu: I64 = np.zeros(cap, np.int64)
        self.used_mem: I64 = np.zeros(cap, np.int64)
        self.used_pods: I64 = np.zeros(cap, np.int64)
        self.groups: I64 = np.zeros(cap, np.int64)  # GROUP_BITS of the groups the node accepts
        self.unschedulable: npt.NDArray[np.bool_] = np.zeros(cap, np.bool_)
        # kube-scheduler sends the same 5,000 NodeNames to every filter and prioritize call: mapping them to
        # rows (a hash and a dict lookup per name) cost more than the verb's whole vector work, so the last
        # mapping is kept, keyed on the list (joined) and on ``layout``, which changes whenever a name gains
        # or loses a row (the used_* columns may change freely: the rows stay valid).
        self.layout = 0
        self._index_key: str | None = None
        self._index_layout = -1
        self._index: RowIndex | None = None

    def _grow(self) -> None:
        cap = 2 * len(self.alloc_cpu)
        for name in (*self.COLUMNS, "unschedulable"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def set_node(self, name: str, entry: NodeEntry) -> int:
        i = self.row.get(name)
        if i is None:
            if self._free_rows:
                i = self._free_rows.pop()
            else:
                if self._size == len(self.alloc_cpu):
                    self._grow()
                i = self._size
                self._size += 1
            self.row[name] = i
            self.layout += 1
        alloc = entry.node.allocatable
        self.alloc_cpu[i] = saturate(alloc.cpu_milli)
        self.alloc_mem[i] = saturate(alloc.memory_bytes)
        self.alloc_pods[i] = saturate(alloc.pods)
        self.unschedulable[i] = entry.node.unschedulable
        self.groups[i] = sum(GROUP_BITS[g] for g in entry.accepts)
        return i

    def remove(self, name: str) -> None:
        i = self.row.pop(name, None)
        if i is not None:
            self._free_rows.append(i)
            self.layout += 1

    def cached_index(self, key: str) -> RowIndex | None:
        """The row index remembered for the name list ``key`` (see ``remember_index``), if still valid."""
        if self._index is not None and self._index_layout == self.layout and self._index_key == key:
            return self._index
        return None

    def forget_index(self) -> None:
        """Drop the remembered row index (the next list is mapped name by name)."""
        self._index_key, self._index = None, None

    def remember_index(self, key: str, index: RowIndex) -> None:
        """Keep ``index`` for the name list whose NUL-joined form is ``key`` (one entry: the last list)."""
        self._index_key, self._index_layout, self._index = key, self.layout, index

    def set_used(self, i: int, requested: Resources, count: int) -> None:
        self.used_cpu[i] = saturate(requested.cpu_milli)
        self.used_mem[i] = saturate(requested.memory_bytes)
        self.used_pods[i] = saturate(count)


class RequestPods:
    """Parsed request Pods by UID (latest resourceVersion only), bounded, oldest dropped first."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._by_uid: dict[str, tuple[str, Any]] = {}

    def get(self, uid: str, resource_version: str) -> Any | None:
        hit = self._by_uid.get(uid)
        return hit[1] if hit is not None and hit[0] == resource_version else None

    def latest(self, uid: str) -> Any | None:
        hit = self._by_uid.get(uid)
        return hit[1] if hit is not None else None

    def put(self, uid: str, resource_version: str, parsed: Any) -> None:
        self._by_uid.pop(uid, None)
        self._by_uid[uid] = (resource_version, parsed)
        while len(self._by_uid) > self.limit:
            del self._by_uid[next(iter(self._by_uid))]

    def drop(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        return len(self._by_uid)


# ---------------------------------------------------------------------------------------------- snapshot


@dataclass(slots=True)
class NodeEntry:
    node: Node  # without pods: the snapshot keeps them per node name
    accepts: frozenset[NodeGroup]
    # spec.taints: kube-scheduler applies them before the verbs see a node, but the QoS controller and the
    # autoscaler choose among the snapshot's nodes themselves (extender.core.taints)
    taints: tuple[Taint, ...] = ()


@dataclass(slots=True)
class PodEntry:
    pod: Pod
    created_at: float | None
    problems: tuple[Problem, ...] = ()
    deleting: bool = False
    scheduler_name: str = "default-scheduler"
    """spec.schedulerName (the API server's default when absent): the bind verb binds only its own profiles' pods."""
    resource_version: str | None = None
    """metadata.resourceVersion of the object parsed: a verb handed the same version of an unbound pod reuses
    ``pod`` instead of parsing its request's copy again (``extender.webhook.verbs._pod``)."""


@dataclass(slots=True)
class _NodePods:
    pods: dict[str, Pod] = field(default_factory=dict)
    requested: Resources = field(default_factory=Resources)


class Snapshot:
    """Nodes by name and pods by ``namespace/name``, with per-node totals kept incrementally.

    ``ready`` turns true once both a full node list and a full pod list were applied; until then the
    webhook answers errors (never decide on a half-empty cache).
    """

    def __init__(self, config: SnapshotSettings) -> None:
        self.config = config
        # The batch resources always: they carry the slack controller's published prediction, which the
        # filter and score verbs of co-located pods read (core.slack.with_batch_resources).
        self._managed = with_batch_resources(config.scheduling.managed_resources)
        self.nodes: dict[str, NodeEntry] = {}
        self.pods: dict[str, PodEntry] = {}
        self._by_node: dict[str, _NodePods] = {}
        self._uids: dict[str, str] = {}
        self._views: dict[str, Node] = {}  # node_view cache, dropped whenever what it shows changes
        self.table = NodeTable()
        self._dirty: set[str] = set()  # nodes whose table row's used_* columns are stale
        self.request_pods = RequestPods()
        self.ledger = BindLedger(config.bind.ledger_ttl_seconds, on_change=self._invalidate)
        self.bound_at: dict[str, float] = {}  # pods we bound -> when (start-time fallback, SLI accounting)
        self.nodes_synced = False
        self.pods_synced = False
        self.node_resource_version: str | None = None
        self.pod_resource_version: str | None = None
        self.last_update: float | None = None
        self.conversion_errors = 0

    # ------------------------------------------------------------------------------------------ status

    @property
    def ready(self) -> bool:
        return self.nodes_synced and self.pods_synced

    def age(self, now: float) -> float | None:
        """Seconds since the last applied list or event (None before the first)."""
        return None if self.last_update is None else max(0.0, now - self.last_update)

    def _invalidate(self, node: str) -> None:
        self._views.pop(node, None)
        self._dirty.add(node)

    def fresh_table(self) -> NodeTable:
        """The node table with every dirty row refreshed (O(changed nodes) since the last call)."""
        if self._dirty:
            row = self.table.row
            for name in self._dirty:
                i = row.get(name)
                if i is not None:
                    requested, count = self.requested_on(name)
                    self.table.set_used(i, requested, count)
            self._dirty.clear()
        return self.table

    def _touch(self, now: float | None) -> None:
        if now is not None:
            self.last_update = now

    # ------------------------------------------------------------------------------------------- nodes

    def apply_node(self, event_type: str, obj: Mapping[str, Any], now: float | None = None) -> None:
        """One watch event (ADDED / MODIFIED / DELETED) for a Node."""
        self._touch(now)
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            self.conversion_errors += 1
            return
        self._views.pop(name, None)
        if event_type == "DELETED":
            self.nodes.pop(name, None)
            self.table.remove(name)
            return
        try:
            node = node_from_k8s(obj, self.config.node_groups, self._managed)
        except (InvalidInputError, TypeError, AttributeError):
            self.conversion_errors += 1
            self.nodes.pop(name, None)  # a node we cannot read is a node we cannot offer
            self.table.remove(name)
            return
        entry = NodeEntry(node, node_group_of(node.labels, self.config.node_groups), taints_of(obj))
        self.nodes[name] = entry
        self.table.set_node(name, entry)
        self._dirty.add(name)

    def replace_nodes(
        self, items: Iterable[Mapping[str, Any]], resource_version: str | None, now: float | None = None
    ) -> None:
        """A full list: the new truth (after start or a 410 Gone)."""
        self.nodes.clear()
        self._views.clear()
        self.table.clear()
        self._dirty.clear()
        for obj in items:
            self.apply_node("ADDED", obj, now)
        self.node_resource_version = resource_version
        self.nodes_synced = True
        self._touch(now)

    # -------------------------------------------------------------------------------------------- pods

    def _unindex(self, key: str) -> None:
        entry = self.pods.pop(key, None)
        if entry is None:
            return
        if entry.pod.uid and self._uids.get(entry.pod.uid) == key:
            del self._uids[entry.pod.uid]
        node = entry.pod.node_name
        if node is not None:
            slot = self._by_node.get(node)
            if slot is not None and key in slot.pods:
                self._views.pop(node, None)
                self._dirty.add(node)
                del slot.pods[key]
                slot.requested = slot.requested - entry.pod.requests
                if not slot.pods:
                    del self._by_node[node]

    def _index(self, key: str, entry: PodEntry) -> None:
        self.pods[key] = entry
        if entry.pod.uid:
            self._uids[entry.pod.uid] = key
        node = entry.pod.node_name
        if node is not None:
            self._views.pop(node, None)
            self._dirty.add(node)
            slot = self._by_node.setdefault(node, _NodePods())
            slot.pods[key] = entry.pod
            slot.requested = slot.requested + entry.pod.requests

    def apply_pod(self, event_type: str, obj: Mapping[str, Any], now: float | None = None) -> tuple[Problem, ...]:
        """One watch event for a Pod; returns the annotation problems found (for an Event on the pod)."""
        self._touch(now)
        try:
            key = pod_key(obj)
        except (InvalidInputError, TypeError, AttributeError):
            self.conversion_errors += 1
            return ()
        self._unindex(key)
        if event_type == "DELETED" or is_terminal(obj):
            # Gone or finished: it frees its node, and any assumption of ours about it is moot (also one a
            # bind still in flight made: the bind must not bring it back, see assume_bind).
            self.ledger.forget(key)
            self.bound_at.pop(key, None)
            meta = obj.get("metadata")
            uid = meta.get("uid") if isinstance(meta, dict) else None
            if isinstance(uid, str):
                self.request_pods.drop(uid)
            return ()
        try:
            pod, problems = pod_from_k8s(
                obj,
                self.config.pod_defaults,
                self.config.policy.classes,
                self._managed,
                started_at=self.bound_at.get(key),
            )
        except (InvalidInputError, TypeError, AttributeError):
            self.conversion_errors += 1
            return ()
        meta = obj.get("metadata")
        created = parse_timestamp(meta.get("creationTimestamp")) if isinstance(meta, dict) else None
        deleting = isinstance(meta, dict) and meta.get("deletionTimestamp") is not None
        spec = obj.get("spec")
        scheduler = spec.get("schedulerName") if isinstance(spec, dict) else None
        scheduler_name = scheduler if isinstance(scheduler, str) and scheduler else "default-scheduler"
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self._index(
            key, PodEntry(pod, created, problems, deleting, scheduler_name, rv if isinstance(rv, str) else None)
        )
        if pod.node_name is not None:
            self.ledger.confirm(key)
        return problems

    def replace_pods(
        self, items: Iterable[Mapping[str, Any]], resource_version: str | None, now: float | None = None
    ) -> list[tuple[str, tuple[Problem, ...]]]:
        """A full pod list; returns (pod key, problems) for pods with annotation problems."""
        self.pods.clear()
        self._by_node.clear()
        self._uids.clear()
        self._views.clear()
        self._dirty.update(self.table.row)
        found: list[tuple[str, tuple[Problem, ...]]] = []
        for obj in items:
            problems = self.apply_pod("ADDED", obj, now)
            if problems:
                found.append((pod_key(obj), problems))
        for key in [k for k in self.bound_at if k not in self.pods and k not in self.ledger]:
            del self.bound_at[key]
        self.pod_resource_version = resource_version
        self.pods_synced = True
        self._touch(now)
        return found

    # ------------------------------------------------------------------------------------------- reads

    def key_for_uid(self, uid: str) -> str | None:
        return self._uids.get(uid)

    def pods_on(self, node: str, exclude: str | None = None) -> list[Pod]:
        """Pods occupying ``node``: observed ones plus our assumed bindings not observed yet."""
        slot = self._by_node.get(node)
        out = [p for k, p in slot.pods.items() if k != exclude] if slot is not None else []
        for entry in self.ledger.on_node(node):
            key = entry.key
            if key != exclude and (slot is None or key not in slot.pods):
                out.append(entry.pod)
        return out

    def requested_on(self, node: str, exclude: str | None = None) -> tuple[Resources, int]:
        """(total requests, pod count) on ``node`` incl. assumed bindings, without ``exclude``: the fast path
        of filter, O(1) for a node without assumptions (totals are kept incrementally)."""
        slot = self._by_node.get(node)
        requested = slot.requested if slot is not None else Resources()
        count = len(slot.pods) if slot is not None else 0
        if slot is not None and exclude is not None and exclude in slot.pods:
            requested = requested - slot.pods[exclude].requests
            count -= 1
        for entry in self.ledger.on_node(node):
            key = entry.key
            if key != exclude and (slot is None or key not in slot.pods):
                requested = requested + entry.source.requests
                count += 1
        return requested, count

    def node_view(self, name: str, exclude: str | None = None) -> Node | None:
        """The core Node with its pods (observed + assumed, minus ``exclude``), or None if unknown."""
        entry = self.nodes.get(name)
        if entry is None:
            return None
        cacheable = exclude is None or not self._holds(name, exclude)
        if cacheable:
            cached = self._views.get(name)
            if cached is not None:
                return cached
        n = entry.node
        view = Node(
            n.name,
            n.allocatable,
            n.capacity,
            n.labels,
            n.group,
            n.flavour,
            tuple(self.pods_on(name, exclude)),
            n.unschedulable,
            n.created_at,
        )
        if cacheable:
            self._views[name] = view
        return view

    def _holds(self, node: str, key: str) -> bool:
        slot = self._by_node.get(node)
        if slot is not None and key in slot.pods:
            return True
        return any(e.key == key for e in self.ledger.on_node(node))

    def counts(self) -> dict[str, int]:
        bound = sum(len(s.pods) for s in self._by_node.values())
        return {
            "nodes": len(self.nodes),
            "pods": len(self.pods),
            "bound_pods": bound,
            "assumed_pods": len(self.ledger),
        }

    # ------------------------------------------------------------------------------------------ binds

    def assume_bind(self, pod: Pod, node: str, now: float) -> LedgerEntry:
        """Before the Binding POST (kube-scheduler's assume()): the pod occupies ``node`` from now on, so a
        filter running while the bind is in flight never offers the same space twice. ``cancel_bind`` undoes
        it when the bind fails; a DELETED event during the call forgets it (and nothing brings it back)."""
        entry = self.ledger.assume(pod, node, now)
        self.bound_at[pod.key] = now
        return entry

    def cancel_bind(self, entry: LedgerEntry) -> None:
        """The bind failed: drop our assumption, unless something newer replaced it."""
        if self.ledger.get(entry.key) is entry:
            self.ledger.forget(entry.key)
            if self.bound_at.get(entry.key) == entry.assumed_at:
                del self.bound_at[entry.key]

    def record_bind(self, pod: Pod, node: str, now: float) -> None:
        """A bind made outside the bind verb (replays, tests): assume it unless the watch already shows it."""
        current = self.pods.get(pod.key)
        if current is not None and current.pod.node_name == node:
            self.bound_at[pod.key] = now
            return
        self.assume_bind(pod, node, now)
