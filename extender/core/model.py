"""The shared vocabulary of every decision: resources, nodes, pods, classes, flavours.

Plain frozen dataclasses, no I/O. The webhook, controller, sidecar, agent and simulator all convert their
world into these types, so one policy function serves all of them. Resources are integers (millicores,
bytes, pod slots) because Kubernetes compares requests exactly; floats would let 0.1 + 0.2 over-commit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from enum import StrEnum

__all__ = [
    "ANNOTATION_PREFIX",
    "DEFAULT_CLASSES",
    "Flavour",
    "InvalidInputError",
    "Node",
    "NodeGroup",
    "Pod",
    "QuantityError",
    "Resources",
    "ServiceClass",
    "WorkloadKind",
    "cpu_millicores",
    "memory_bytes",
    "parse_quantity",
]

ANNOTATION_PREFIX = "qos.kube-qos-extender.io/"


class InvalidInputError(ValueError):
    """Input that no policy can decide on (negative requests, NaN, unknown class...).

    A ValueError subclass so shells can map it to a 4xx / an Event without catching unrelated bugs.
    """


class QuantityError(InvalidInputError):
    """A Kubernetes resource quantity string that does not parse."""


# Kubernetes resource.Quantity grammar: <signedNumber><suffix>, suffix binary (Ki..Ei), decimal SI
# (n u m "" k M G T P E) or a decimal exponent (e3 / E-2).
_QUANTITY_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity exactly (Decimal, never float rounding).

    Ints are accepted as-is; floats only when finite, because a NaN request would compare false with
    everything and silently "fit" anywhere.
    """
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or number, got bool {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity must be finite, got {value!r}")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string or number, got {type(value).__name__}")
    text = value.strip()
    m = _QUANTITY_RE.match(text)
    if not m:
        raise QuantityError(f"malformed quantity {value!r} (expected e.g. '500m', '1.5Gi', '2')")
    number_text, suffix = m.group(1), m.group(2) or ""
    try:
        number = Decimal(number_text)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"malformed quantity {value!r}") from exc
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number.scaleb(int(suffix[1:]))


def _nonneg_int(amount: Decimal, what: str, original: object) -> int:
    if amount < 0:
        raise QuantityError(f"{what} must not be negative, got {original!r}")
    # Kubernetes rounds fractional values up (Quantity.MilliValue / Value use ceiling).
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def cpu_millicores(value: str | int | float) -> int:
    """CPU quantity -> millicores, rounded up like Quantity.MilliValue()."""
    return _nonneg_int(parse_quantity(value) * 1000, "cpu", value)


def memory_bytes(value: str | int | float) -> int:
    """Memory quantity -> bytes, rounded up like Quantity.Value()."""
    return _nonneg_int(parse_quantity(value), "memory", value)


def _check_count(name: str, value: int) -> None:
    if type(value) is int:  # the hot path: Resources are built in every placement trial
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class Resources:
    """A vector of schedulable amounts. Extended resources are kept sorted for equality and hashing.

    Arithmetic may go negative (a node's free space after an over-commit is a useful signal); construction
    from user input should go through ``Resources.request`` which refuses negatives.
    """

    cpu_milli: int = 0
    memory_bytes: int = 0
    pods: int = 0
    extended: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        _check_count("cpu_milli", self.cpu_milli)
        _check_count("memory_bytes", self.memory_bytes)
        _check_count("pods", self.pods)
        for name, amount in self.extended:
            _check_count(f"extended resource {name}", amount)

    @staticmethod
    def request(
        cpu_milli: int = 0, memory_bytes: int = 0, pods: int = 1, extended: Mapping[str, int] | None = None
    ) -> Resources:
        """A pod's request: non-negative by construction, one pod slot by default."""
        ext = tuple(sorted((extended or {}).items()))
        for name, amount in (("cpu", cpu_milli), ("memory", memory_bytes), ("pods", pods), *ext):
            if isinstance(amount, bool) or not isinstance(amount, int):
                raise InvalidInputError(f"{name} request must be an integer, got {amount!r}")
            if amount < 0:
                raise InvalidInputError(f"{name} request must not be negative, got {amount}")
        return Resources(cpu_milli, memory_bytes, pods, ext)

    def ext(self, name: str) -> int:
        for key, amount in self.extended:
            if key == name:
                return amount
        return 0

    def _ext_merge(self, other: Resources, sign: int) -> tuple[tuple[str, int], ...]:
        if not self.extended and not other.extended:
            return ()
        merged = dict(self.extended)
        for key, amount in other.extended:
            merged[key] = merged.get(key, 0) + sign * amount
        return tuple(sorted((k, v) for k, v in merged.items() if v != 0))

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.memory_bytes + other.memory_bytes,
            self.pods + other.pods,
            self._ext_merge(other, 1),
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli - other.cpu_milli,
            self.memory_bytes - other.memory_bytes,
            self.pods - other.pods,
            self._ext_merge(other, -1),
        )

    def fits_in(self, free: Resources) -> bool:
        """True when every dimension of self is <= free (extended resources included)."""
        if self.cpu_milli > free.cpu_milli or self.memory_bytes > free.memory_bytes or self.pods > free.pods:
            return False
        return all(amount <= free.ext(name) for name, amount in self.extended)

    def shortfall(self, free: Resources) -> list[str]:
        """Names of the dimensions that do not fit: the human reason in FailedNodes."""
        short: list[str] = []
        if self.cpu_milli > free.cpu_milli:
            short.append("cpu")
        if self.memory_bytes > free.memory_bytes:
            short.append("memory")
        if self.pods > free.pods:
            short.append("pods")
        short.extend(name for name, amount in self.extended if amount > free.ext(name))
        return short

    def is_nonnegative(self) -> bool:
        return (
            self.cpu_milli >= 0 and self.memory_bytes >= 0 and self.pods >= 0 and all(v >= 0 for _, v in self.extended)
        )

    @staticmethod
    def total(items: Iterable[Resources]) -> Resources:
        acc = Resources()
        for item in items:
            acc = acc + item
        return acc


class WorkloadKind(StrEnum):
    """batch = finite runtime, migratable; service = long-running (paper 000 §4 node groups)."""

    BATCH = "batch"
    SERVICE = "service"


class NodeGroup(StrEnum):
    BATCH = "batch"
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class ServiceClass:
    """An availability SLO class (paper 002 §3.1): sigma = SLO, importance 1 = most important.

    safety_margin_seconds: Q below it shields an instance from preemption (paper 002 §3.3.1; 10 s in §4.1.3).
    priority: the PriorityClass value of the priority-based reference policy (paper 002 §4.1.2).
    """

    name: str
    slo: float
    importance: int
    safety_margin_seconds: float = 10.0
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError("class name must not be empty")
        if not (isinstance(self.slo, (int, float)) and math.isfinite(self.slo) and 0.0 < self.slo <= 1.0):
            raise InvalidInputError(f"class {self.name}: slo must be in (0, 1], got {self.slo!r}")
        if isinstance(self.importance, bool) or not isinstance(self.importance, int) or self.importance < 1:
            raise InvalidInputError(f"class {self.name}: importance must be an integer >= 1")
        if not math.isfinite(self.safety_margin_seconds):
            raise InvalidInputError(f"class {self.name}: safety margin must be finite")

    @property
    def overhead_cap(self) -> float:
        """Maximum preemption overhead for same-class preemption (paper 002 §4.1.3: 1 - sigma)."""
        return 1.0 - self.slo


# Paper 002 §4.2 classes: gold 100 %, silver 90 %, bronze 50 %; priorities as in its §4.1.2 reference.
DEFAULT_CLASSES: Mapping[str, ServiceClass] = {
    "gold": ServiceClass("gold", 1.0, 1, 10.0, priority=1000),
    "silver": ServiceClass("silver", 0.9, 2, 10.0, priority=500),
    "bronze": ServiceClass("bronze", 0.5, 3, 10.0, priority=100),
}


@dataclass(frozen=True, slots=True)
class Flavour:
    """An instance type a node group can be grown with (paper 000 Table 7)."""

    name: str
    capacity: Resources
    price_per_hour: float

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError("flavour name must not be empty")
        if self.capacity.cpu_milli <= 0 or self.capacity.memory_bytes <= 0 or self.capacity.pods <= 0:
            raise InvalidInputError(f"flavour {self.name}: cpu, memory and pods must be positive")
        if not (math.isfinite(self.price_per_hour) and self.price_per_hour > 0):
            raise InvalidInputError(
                f"flavour {self.name}: price per hour must be a positive number, got {self.price_per_hour!r}"
            )


_new_object = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class Pod:
    """One instance of a request. ``request_id`` is the owner (Job/ReplicaSet/...), which outlives the pod.

    runtime_seconds is the batch runtime estimate (None for services); started_at is when its current run
    began (None while pending); progress_seconds is work already done before the current run (kept by
    checkpoint/restore, lost by eviction).
    """

    name: str
    requests: Resources
    request_id: str = ""
    namespace: str = "default"
    uid: str = ""
    priority: int = 0
    class_name: str = "bronze"
    kind: WorkloadKind = WorkloadKind.SERVICE
    runtime_seconds: float | None = None
    started_at: float | None = None
    progress_seconds: float = 0.0
    node_name: str | None = None
    migratable: bool = True

    _key: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", f"{self.namespace}/{self.name}")
        if not self.requests.is_nonnegative():
            raise InvalidInputError(f"pod {self.name}: negative request {self.requests}")
        if self.runtime_seconds is not None and not (math.isfinite(self.runtime_seconds) and self.runtime_seconds >= 0):
            raise InvalidInputError(f"pod {self.name}: runtime must be a finite non-negative number")
        if not math.isfinite(self.progress_seconds) or self.progress_seconds < 0:
            raise InvalidInputError(f"pod {self.name}: progress must be a finite non-negative number")
        if self.started_at is not None and not math.isfinite(self.started_at):
            raise InvalidInputError(f"pod {self.name}: start time must be finite")

    @property
    def key(self) -> str:
        return self._key

    def bound_to(self, node: str, now: float) -> Pod:
        """This pod running on ``node`` since ``now`` (the bind verb's assumption, made on every bind).

        A field-by-field copy instead of ``__init__``: this pod already passed ``__post_init__``'s checks and only
        ``started_at`` and ``node_name`` change, so re-running them would cost half the bind decision. ``now``
        must be finite (a clock reading), as ``__post_init__`` would demand.
        """
        if not math.isfinite(now):
            raise InvalidInputError(f"pod {self.name}: start time must be finite")
        clone = _new_object(Pod)
        _set(clone, "name", self.name)
        _set(clone, "requests", self.requests)
        _set(clone, "request_id", self.request_id)
        _set(clone, "namespace", self.namespace)
        _set(clone, "uid", self.uid)
        _set(clone, "priority", self.priority)
        _set(clone, "class_name", self.class_name)
        _set(clone, "kind", self.kind)
        _set(clone, "runtime_seconds", self.runtime_seconds)
        _set(clone, "started_at", now)
        _set(clone, "progress_seconds", self.progress_seconds)
        _set(clone, "node_name", node)
        _set(clone, "migratable", self.migratable)
        _set(clone, "_key", self._key)
        return clone

    @property
    def owner(self) -> str:
        return self.request_id or self.key

    def remaining_runtime(self, now: float) -> float:
        """Seconds of work left for a batch pod at ``now`` (0 for services: they never finish on their own).

        Used by time bins (paper 000 §5.1); a pod that overran its estimate counts as finishing now.
        """
        if self.kind is not WorkloadKind.BATCH or self.runtime_seconds is None:
            return 0.0
        ran = self.progress_seconds
        if self.started_at is not None:
            ran += max(0.0, now - self.started_at)
        return max(0.0, self.runtime_seconds - ran)


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the policies see it: allocatable space, group, flavour and the pods bound to it."""

    name: str
    allocatable: Resources
    capacity: Resources | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    group: NodeGroup | None = None
    flavour: str | None = None
    pods: tuple[Pod, ...] = ()
    unschedulable: bool = False
    created_at: float | None = None

    _requested: Resources = field(init=False, repr=False, compare=False, default=Resources())
    _free: Resources = field(init=False, repr=False, compare=False, default=Resources())
    # (now, remaining_runtime(now)) of the last call: a pass asks every node at one ``now`` once per pod it
    # ranks by time bin (the controller's decide pass, packing.time_bin_order), and the answer is O(pods)
    _remaining: tuple[float, float] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not self.allocatable.is_nonnegative():
            raise InvalidInputError(f"node {self.name}: negative allocatable {self.allocatable}")
        # Computed once: a Node is immutable, and policies ask for its free space in every trial.
        object.__setattr__(self, "_requested", Resources.total(p.requests for p in self.pods))
        object.__setattr__(self, "_free", self.allocatable - self._requested)

    @property
    def requested(self) -> Resources:
        return self._requested

    @property
    def free(self) -> Resources:
        return self._free

    def with_pod(self, pod: Pod) -> Node:
        """A copy with ``pod`` added: decisions simulate placements without mutating the snapshot."""
        return replace(self, pods=(*self.pods, pod))

    def without_pods(self, keys: Iterable[str]) -> Node:
        gone = set(keys)
        return replace(self, pods=tuple(p for p in self.pods if p.key not in gone))

    def utilization(self) -> float:
        """max(cpu, memory) requested / allocatable, as cluster-autoscaler's scale-down threshold uses."""
        req = self.requested
        cpu = req.cpu_milli / self.allocatable.cpu_milli if self.allocatable.cpu_milli else 1.0
        mem = req.memory_bytes / self.allocatable.memory_bytes if self.allocatable.memory_bytes else 1.0
        return max(cpu, mem)

    def remaining_runtime(self, now: float) -> float:
        """Remaining runtime of the node's longest batch pod: what its time bin is computed from."""
        remembered = type(now) is float  # float clocks only (an int equal to one is another input)
        memo = self._remaining
        if remembered and memo is not None and memo[0] == now:
            return memo[1]
        value = max((p.remaining_runtime(now) for p in self.pods), default=0.0)
        if remembered:
            object.__setattr__(self, "_remaining", (now, value))
        return value
