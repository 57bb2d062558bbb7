"""Our flavours as cluster-autoscaler node groups: the state and rules behind the externalgrpc cloud provider.

Pure (no I/O, no clock: ``now`` is given; the gRPC shell is providers/externalgrpc.py). One node group per
(workload group, flavour): id ``<group>-<flavour>``, e.g. ``batch-m1.large``; a new node gets the group's selector
labels, the flavour label, ``provisioned-by=qos-autoscaler`` and ``spec.providerID = <prefix><node name>`` (what CA
matches its instances to registered Nodes by).

The provisioning ledger is the sidecar's own (``core.autoscale.ProvisioningLedger``, paper 003 Alg. 7): every node
IncreaseSize asks for is recorded at once, so the target size (joined members + nodes still booting) moves by the
delta immediately and CA's next loop counts the booting nodes as upcoming instead of buying them again; a node that
joins leaves the ledger (its lag is recorded); one that does not join within the provisioning timeout is expired
(the shell cancels it at the provider). The autoscaler's own loop, which runs in dry-run with this provider, reads
the same ledger, so its plans do not count again what cluster-autoscaler already bought.

Errors are ``NodeGroupError(code, message)`` with the gRPC status name the shell answers: NOT_FOUND (no such node
group), INVALID_ARGUMENT (a delta of the wrong sign, a node that is not in the group, missing or malformed fields),
FAILED_PRECONDITION (the size would leave [min, max], the total node limit, or a decrease that would have to remove
registered nodes). cluster-autoscaler treats every non-OK status as a failed call of that method; only UNIMPLEMENTED
has a meaning of its own to it, and only for the optional methods.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from extender.autoscaler.loop import PROVISIONED_BY_LABEL, PROVISIONED_BY_VALUE, ProvisionRequest
from extender.core import autoscale
from extender.core.model import Flavour, NodeGroup, Resources
from extender.settings.sections import NodeGroupsConfig

__all__ = [
    "PRICE_ANNOTATION",
    "InstanceView",
    "NodeGroupError",
    "NodeGroupSpec",
    "NodeGroups",
    "Synced",
    "hours_between",
    "node_group_id",
]

PRICE_ANNOTATION = "qos.kube-qos-extender.io/price-per-hour"

RUNNING, CREATING, DELETING = "instanceRunning", "instanceCreating", "instanceDeleting"


class NodeGroupError(Exception):
    """A refused call: ``code`` is the gRPC status name to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def node_group_id(group: NodeGroup, flavour: Flavour) -> str:
    return f"{group.value}-{flavour.name}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"


@dataclass(frozen=True, slots=True)
class NodeGroupSpec:
    id: str
    group: NodeGroup
    flavour: Flavour
    min_size: int
    max_size: int
    labels: Mapping[str, str]  # what every node of the group carries (and what identifies it)

    @property
    def debug(self) -> str:
        c = self.flavour.capacity
        return (
            f"{self.group.value} group, flavour {self.flavour.name}: cpu {c.cpu_milli}m, memory {c.memory_bytes}B, "
            f"pods {c.pods}, ${self.flavour.price_per_hour}/h (qos-extender autoscaler)"
        )


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str  # = the Node's spec.providerID
    state: str  # RUNNING / CREATING / DELETING


@dataclass(frozen=True, slots=True)
class Synced:
    """What one ``sync`` found: nodes that joined (with their request-to-join lag) and requests that expired."""

    arrived: tuple[tuple[str, float], ...] = ()
    expired: tuple[tuple[autoscale.Provisioning, str], ...] = ()  # (entry, node group id)


@dataclass
class NodeGroups:
    """Node groups = groups x flavours, with the ledger of requested nodes and the nodes being deleted.

    ``members`` everywhere is the current set of registered Nodes: name -> labels (the shell passes the
    snapshot's). Only nodes labelled ``provisioned-by=qos-autoscaler`` belong to a node group: static or
    hand-made nodes are never cluster-autoscaler's to remove.
    """

    specs: Mapping[str, NodeGroupSpec]
    flavour_label: str
    provider_id_prefix: str = "kwok://"
    node_name_prefix: str = "qos-ca"
    provisioning_timeout_seconds: float = 900.0
    max_nodes: int = 200
    name_suffix: Callable[[], str] = field(default=lambda: secrets.token_hex(3))
    ledger: autoscale.ProvisioningLedger = field(default_factory=autoscale.ProvisioningLedger)
    owner: dict[str, str] = field(default_factory=dict)  # ledger node name -> node group id
    deleting: dict[str, str] = field(default_factory=dict)  # registered node name -> node group id
    arrivals: list[tuple[str, float]] = field(default_factory=list)  # since the last drain_arrivals()

    @classmethod
    def build(
        cls,
        flavours: Sequence[Flavour],
        node_groups: NodeGroupsConfig,
        groups: Iterable[NodeGroup] = (NodeGroup.SERVICE, NodeGroup.BATCH),
        *,
        min_size: int = 0,
        max_size: int = 10,
        provider_id_prefix: str = "kwok://",
        node_name_prefix: str = "qos-ca",
        provisioning_timeout_seconds: float = 900.0,
        max_nodes: int = 200,
        name_suffix: Callable[[], str] | None = None,
    ) -> NodeGroups:
        autoscale.validate_catalogue(flavours)
        specs: dict[str, NodeGroupSpec] = {}
        for group in groups:
            selector = node_groups.batch_selector if group is NodeGroup.BATCH else node_groups.service_selector
            for flavour in flavours:
                labels = {
                    **selector,
                    node_groups.flavour_label: flavour.name,
                    PROVISIONED_BY_LABEL: PROVISIONED_BY_VALUE,
                }
                spec = NodeGroupSpec(node_group_id(group, flavour), group, flavour, min_size, max_size, labels)
                specs[spec.id] = spec
        return cls(
            specs,
            node_groups.flavour_label,
            provider_id_prefix=provider_id_prefix,
            node_name_prefix=node_name_prefix,
            provisioning_timeout_seconds=provisioning_timeout_seconds,
            max_nodes=max_nodes,
            name_suffix=name_suffix if name_suffix is not None else (lambda: secrets.token_hex(3)),
        )

    def __post_init__(self) -> None:
        self._by_flavour: dict[str, list[NodeGroupSpec]] = {}
        for spec in self.specs.values():
            self._by_flavour.setdefault(spec.flavour.name, []).append(spec)

    # ------------------------------------------------------------------------------------------ lookup

    def spec(self, group_id: str) -> NodeGroupSpec:
        spec = self.specs.get(group_id)
        if spec is None:
            raise NodeGroupError("NOT_FOUND", f"node group {group_id!r} not found (known: {', '.join(self.specs)})")
        return spec

    def provider_id(self, name: str) -> str:
        return f"{self.provider_id_prefix}{name}"

    def group_of_labels(self, labels: Mapping[str, str]) -> NodeGroupSpec | None:
        """The node group whose labels the node carries (all of them), or None."""
        if labels.get(PROVISIONED_BY_LABEL) != PROVISIONED_BY_VALUE:
            return None
        for spec in self._by_flavour.get(labels.get(self.flavour_label, ""), ()):
            if all(labels.get(k) == v for k, v in spec.labels.items()):
                return spec
        return None

    def group_of_node(self, name: str, provider_id: str, labels: Mapping[str, str]) -> NodeGroupSpec | None:
        """CA's NodeGroupForNode: by labels for a registered node; by providerID for a node still in the ledger
        (CA asks about the instances that never registered with a stand-in Node named after the instance id)."""
        spec = self.group_of_labels(labels)
        if spec is not None:
            return spec
        for candidate in (name, provider_id):
            if candidate.startswith(self.provider_id_prefix):
                candidate = candidate[len(self.provider_id_prefix) :]
            if candidate in self.owner:
                return self.specs.get(self.owner[candidate])
        return None

    def _members(self, spec: NodeGroupSpec, members: Mapping[str, Mapping[str, str]]) -> list[str]:
        return sorted(n for n, labels in members.items() if self.group_of_labels(labels) is spec)

    def _pending(self, spec: NodeGroupSpec) -> list[autoscale.Provisioning]:
        return [e for e in self.ledger.entries if self.owner.get(e.node_name) == spec.id]

    # ------------------------------------------------------------------------------------------- state

    def sync(self, members: Mapping[str, Mapping[str, str]], now: float) -> Synced:
        """Ledger entries whose Node registered leave the ledger (lag recorded); entries older than the
        provisioning timeout expire (the caller cancels them); deleted nodes that are gone are forgotten."""
        arrived: list[tuple[str, float]] = []
        for entry in self.ledger.entries:
            if entry.node_name in members:
                lag = max(0.0, now - entry.requested_at)
                arrived.append((entry.node_name, lag))
                self.ledger = self.ledger.arrived(entry.node_name)
                self.owner.pop(entry.node_name, None)
        self.ledger, expired = self.ledger.expire(now, self.provisioning_timeout_seconds)
        gone = tuple((entry, self.owner.pop(entry.node_name, "")) for entry in expired)
        self.deleting = {n: g for n, g in self.deleting.items() if n in members}
        self.arrivals.extend(arrived)
        return Synced(tuple(arrived), gone)

    def withdraw(self, names: Iterable[str]) -> None:
        """Forget requested nodes that will not join (cancelled, or never asked of the backend)."""
        for name in names:
            self.ledger = self.ledger.arrived(name)
            self.owner.pop(name, None)

    def drain_arrivals(self) -> list[tuple[str, float]]:
        out, self.arrivals = self.arrivals, []
        return out

    def groups_of_ledger(self) -> dict[str, NodeGroup]:
        """Ledger node name -> workload group (what the autoscaler loop's ledger view needs)."""
        return {name: self.specs[gid].group for name, gid in self.owner.items() if gid in self.specs}

    def target_size(self, group_id: str, members: Mapping[str, Mapping[str, str]]) -> int:
        spec = self.spec(group_id)
        joined = [n for n in self._members(spec, members) if n not in self.deleting]
        return len(joined) + len(self._pending(spec))

    def _owned_total(self, members: Mapping[str, Mapping[str, str]]) -> int:
        joined = sum(1 for n, labels in members.items() if n not in self.deleting and self.group_of_labels(labels))
        return joined + len(self.ledger.entries)

    def increase(
        self, group_id: str, delta: int, members: Mapping[str, Mapping[str, str]], now: float
    ) -> list[ProvisionRequest]:
        """NodeGroupIncreaseSize: ``delta`` new nodes of the group's flavour, recorded in the ledger at once."""
        spec = self.spec(group_id)
        if delta <= 0:
            raise NodeGroupError("INVALID_ARGUMENT", f"delta must be positive, got {delta}")
        target = self.target_size(group_id, members)
        if target + delta > spec.max_size:
            raise NodeGroupError(
                "FAILED_PRECONDITION",
                f"node group {group_id}: size increase too large: target {target} + delta {delta} > max size "
                f"{spec.max_size}",
            )
        total = self._owned_total(members)
        if total + delta > self.max_nodes:
            raise NodeGroupError(
                "FAILED_PRECONDITION",
                f"node group {group_id}: {total} nodes provisioned by qos-autoscaler + delta {delta} > "
                f"autoscaler.limits.max_nodes {self.max_nodes}",
            )
        out = []
        for _ in range(delta):
            name = f"{self.node_name_prefix}-{spec.group.value}-{_slug(spec.flavour.name)}-{self.name_suffix()}"
            while name in self.owner or name in members:  # a suffix collision: draw again
                name = f"{self.node_name_prefix}-{spec.group.value}-{_slug(spec.flavour.name)}-{self.name_suffix()}"
            self.ledger = self.ledger.add(autoscale.Provisioning(name, spec.flavour, now))
            self.owner[name] = spec.id
            out.append(ProvisionRequest(name, spec.flavour, spec.group, dict(spec.labels), ()))
        return out

    def delete(
        self,
        group_id: str,
        nodes: Sequence[tuple[str, str, Mapping[str, str]]],
        members: Mapping[str, Mapping[str, str]],
    ) -> tuple[list[str], list[str]]:
        """NodeGroupDeleteNodes: (registered node names to delete, ledger names to cancel).

        Each node is (name, providerID, labels) as CA sends it. All are checked before anything changes: one
        node outside the group refuses the whole call (CA then retries the others)."""
        spec = self.spec(group_id)
        if not nodes:
            raise NodeGroupError("INVALID_ARGUMENT", "no nodes to delete")
        registered: list[str] = []
        pending: list[str] = []
        mine = set(self._members(spec, members))
        for name, provider_id, labels in nodes:
            found = self.group_of_node(name, provider_id, labels)
            if found is not spec:
                where = f"node group {found.id}" if found is not None else "no node group of qos-autoscaler"
                what = name or provider_id
                raise NodeGroupError(
                    "INVALID_ARGUMENT", f"node {what!r} does not belong to node group {group_id} ({where})"
                )
            ledger_name = (provider_id or name).removeprefix(self.provider_id_prefix)
            if ledger_name in self.owner and self.owner[ledger_name] == spec.id:
                pending.append(ledger_name)
            elif name in mine:
                if name not in self.deleting:
                    registered.append(name)
            else:
                # labelled for the group but not registered (already gone): nothing left to delete
                continue
        target = self.target_size(group_id, members)
        remove = len(registered) + len(pending)
        if target - remove < spec.min_size:
            raise NodeGroupError(
                "FAILED_PRECONDITION",
                f"node group {group_id}: deleting {remove} of {target} nodes would go below min size {spec.min_size}",
            )
        for name in registered:
            self.deleting[name] = spec.id
        self.withdraw(pending)  # no longer expected to join
        return registered, pending

    def decrease_target(self, group_id: str, delta: int) -> list[str]:
        """NodeGroupDecreaseTargetSize: withdraw ``-delta`` requests that have not registered (newest first).
        Never removes a registered node: a larger decrease is refused."""
        spec = self.spec(group_id)
        if delta >= 0:
            raise NodeGroupError("INVALID_ARGUMENT", f"delta must be negative, got {delta}")
        pending = sorted(self._pending(spec), key=lambda e: (e.requested_at, e.node_name))
        if -delta > len(pending):
            raise NodeGroupError(
                "FAILED_PRECONDITION",
                f"node group {group_id}: cannot decrease the target by {-delta}: only {len(pending)} requested nodes "
                "have not registered (registered nodes are removed with DeleteNodes)",
            )
        withdrawn = [e.node_name for e in pending[len(pending) + delta :]]
        self.withdraw(withdrawn)
        return withdrawn

    def instances(self, group_id: str, members: Mapping[str, Mapping[str, str]]) -> list[InstanceView]:
        spec = self.spec(group_id)
        out = [
            InstanceView(self.provider_id(n), DELETING if n in self.deleting else RUNNING)
            for n in self._members(spec, members)
        ]
        out += [InstanceView(self.provider_id(e.node_name), CREATING) for e in self._pending(spec)]
        return out

    def template_request(self, group_id: str) -> ProvisionRequest:
        """The request a new node of the group would be made from (the template Node is its manifest)."""
        spec = self.spec(group_id)
        name = f"template-node-for-{_slug(spec.id)}"
        return ProvisionRequest(name, spec.flavour, spec.group, dict(spec.labels), ())

    # ------------------------------------------------------------------------------------------ prices

    def node_price_per_hour(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> float:
        """A node's price: its flavour's (flavour label in the catalogue), else its price annotation."""
        flavour = labels.get(self.flavour_label)
        for spec in self.specs.values():
            if spec.flavour.name == flavour:
                return spec.flavour.price_per_hour
        raw = annotations.get(PRICE_ANNOTATION) or labels.get(PRICE_ANNOTATION)
        try:
            price = float(raw) if raw else math.nan
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price < 0:
            raise NodeGroupError(
                "NOT_FOUND",
                f"no price for this node: label {self.flavour_label}={flavour!r} is not a catalogued flavour and "
                f"annotation {PRICE_ANNOTATION} is {raw!r}",
            )
        return price

    def pod_price_per_hour(self, requests: Resources) -> float:
        """The theoretical minimum price of the pod on a perfectly matching machine: the cheapest fractional mix of
        our flavours covering its cpu and memory (``core.autoscale.fluid_lower_bound_per_hour``). So CA's price
        expander's node-price / pod-price ratio is the inverse of our cost-efficiency: low = money well spent."""
        flavours = list({s.flavour.name: s.flavour for s in self.specs.values()}.values())
        return autoscale.fluid_lower_bound_per_hour(Resources(requests.cpu_milli, requests.memory_bytes), flavours)


def hours_between(start: float, end: float) -> float:
    """The priced period in hours; refused when it is negative or not finite."""
    if not (math.isfinite(start) and math.isfinite(end)) or end < start:
        raise NodeGroupError("INVALID_ARGUMENT", f"bad pricing period: start {start}, end {end}")
    return (end - start) / 3600.0
