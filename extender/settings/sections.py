"""The sections of the extender's settings (every option declared once: type, default, bounds, description), and
the narrow views the low layers take of them.

Why apart from the root (extender.settings.extender.ExtenderConfig and its loader): a component receives the sections it
reads and nothing more, and the low layers (kube, the webhook's verbs, core) never import the settings root --
an import-linter contract keeps it so. What the verbs and the snapshot read of the whole is a Protocol here
(``PlacementSettings``, ``SnapshotSettings``) that the root satisfies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from extender.core.characterise import CharacteriseConfig, OwnLevel
from extender.core.disruption import Budget, DisruptionKind, Window
from extender.core.model import (
    DEFAULT_CLASSES,
    Flavour,
    InvalidInputError,
    Resources,
    ServiceClass,
    WorkloadKind,
    cpu_millicores,
    memory_bytes,
)
from extender.core.qos import (
    RECOMMENDED_HYSTERESIS_SECONDS,
    RECOMMENDED_PEER_VICTIM_WAIT_SECONDS,
    RECOMMENDED_QUANTUM_SECONDS,
    QosPolicy,
)
from extender.settings.base import ExistingFile, RelativePath, Settings, load_settings

__all__ = [
    "DEFAULT_CLASS_SETTINGS",
    "FLAVOURS_PATH",
    "MARKER_RESOURCE",
    "METRICS_CLIENT_CN",
    "SCHEDULER_CLIENT_CN",
    "BindConfig",
    "Catalogue",
    "CharacteriseSettings",
    "ClassSettings",
    "ColocateConfig",
    "ControllerConfig",
    "DisruptionBudget",
    "DisruptionSettings",
    "DisruptionWindow",
    "FlavourField",
    "KubernetesConfig",
    "LabelSelector",
    "LeaderElectionConfig",
    "LoggingConfig",
    "NodeGroupsConfig",
    "OwnLevelSettings",
    "PlacementSettings",
    "PodDefaults",
    "QosSettings",
    "SchedulingConfig",
    "ServerConfig",
    "SlackConfig",
    "SnapshotSettings",
    "TlsConfig",
    "check_catalogue",
    "parse_flavours",
    "read_catalogue",
]

# Shipped inside the package (package data), so an installed wheel or the image has its default catalogue
# without the source tree; config/flavours.yaml is a symlink to it (hack/ makes the local nodes from it).
FLAVOURS_PATH = Path(__file__).resolve().parent.parent / "flavours.yaml"

MARKER_RESOURCE = "qos.kube-qos-extender.io/managed"

# The client certificates' subject CNs this project's manifests and scripts issue (config/base, hack/).
SCHEDULER_CLIENT_CN = "kube-scheduler-extender-client"
METRICS_CLIENT_CN = "prometheus-extender-client"

NonEmpty = Annotated[str, Field(min_length=1)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


# ------------------------------------------------------------------------------------------------ server


class TlsConfig(Settings):
    """TLS of the webhook's listener. With client_ca_file set, a client certificate must be signed by it or the
    handshake fails, but presenting one is optional at the TLS level (ssl.CERT_OPTIONAL): /healthz, /readyz
    (kubelet probes) and /admission/mutate (the API server) answer without one; every other path answers 403
    unless the certificate's subject CN is allowed for it (verb_clients, metrics_clients)."""

    cert_file: ExistingFile | None = None
    """PEM certificate chain of the server; with key_file, the server speaks HTTPS (set enableHTTPS: true in the
    scheduler's extender config). Relative paths are read from the folder of the file that sets them."""
    key_file: ExistingFile | None = None
    """PEM private key of cert_file (both or neither)."""
    client_ca_file: ExistingFile | None = None
    """PEM bundle of the CAs that sign client certificates (needs cert_file)."""
    verb_clients: tuple[NonEmpty, ...] = (SCHEDULER_CLIENT_CN,)
    """Subject CNs allowed on POST /filter /prioritize /preempt /bind: kube-scheduler's extender client
    certificate. Empty: nobody over TLS."""
    metrics_clients: tuple[NonEmpty, ...] = (METRICS_CLIENT_CN,)
    """Subject CNs allowed on GET /metrics (the scraper). A metrics credential cannot call the verbs, and the
    scheduler's cannot scrape, unless a name is in both lists."""
    reload_interval_seconds: Seconds = 30.0
    """How often the certificate, key and client CA files are read to see whether their contents changed; a
    change is loaded into the live listener (new handshakes use it, open connections keep theirs) and counted in
    qos_extender_certificate_reloads_total. A kubelet updates a mounted Secret within about a minute anyway."""

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @model_validator(mode="after")
    def _pairs(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file: cert_file and key_file must be set together")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file: client certificates need TLS: set cert_file and key_file too")
        return self


class ServerConfig(Settings):
    """The webhook's listener (the scheduler extender verbs, admission, /metrics, probes)."""

    host: NonEmpty = "127.0.0.1"
    """Address to listen on. 127.0.0.1 by default: expose it deliberately (and with TLS) when the scheduler runs on
    another host."""
    port: int = Field(8888, ge=0, le=65535)
    """TCP port (0 picks a free port; the chosen one is logged). Must match the scheduler's extender urlPrefix."""
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=2**31)
    """Largest verb request body accepted, in bytes; larger bodies get 413 with a JSON error. Only a client allowed
    on the verbs (server.tls.verb_clients, or the loopback listener) gets this far: the identity is checked before
    a byte of the body is read. nodeCacheCapable: false sends every candidate Node in full, roughly 3-5 KiB each:
    64 MiB covers ~10,000 nodes."""
    admission_max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, le=2**31)
    """Largest body of POST /admission/mutate, which anyone who reaches the port may call (the API server presents
    no client certificate): a larger declared body gets 413 before it is read, a longer stream is cut at this
    size. 8 MiB covers every AdmissionReview of a pod the API server accepts as JSON: it refuses request bodies
    over 3 MiB (its MaxRequestBodyBytes; etcd then stores at most 1.5 MiB per object), and a review carries
    object and oldObject (null for the CREATE we are registered for) plus a few KiB of request metadata:
    2 x 3 MiB + 2 MiB of margin, an eighth of max_body_bytes. A pod beyond it (a protobuf create whose JSON
    escapes badly) is admitted ungated by failurePolicy Ignore: its ordering is lost, nothing else."""
    read_timeout_seconds: Seconds = 10.0
    """Deadline for a request's headers and body to arrive, from its connection's first byte (or the end of the
    previous request on a kept-alive connection): a client that sends a byte a second is cut off (408 once the
    headers are in, else the connection is closed), so slow bodies cannot pin connections and memory. The API
    server gives an admission webhook at most 30 s in all (5 s in config/controller)."""
    request_timeout_seconds: Seconds = 42.0
    """Per-request deadline; a verb still running then answers 503 with a JSON error. Keep it between
    bind.timeout_seconds and the scheduler's extender httpTimeout (45 s in config/base; kube-scheduler's default
    5 s is too short for bind on a loaded API server). filter, prioritize and preempt answer from memory in
    milliseconds: the deadline matters to bind."""
    tls: TlsConfig = TlsConfig()
    loopback_verbs_port: int | None = Field(None, ge=1, le=65535)
    """A second, verbs-only listener on 127.0.0.1:<port> without TLS (null: off). For the sidecar topology
    (config/base), where kube-scheduler and the extender share the pod's network namespace, so the loopback is
    private to the pod: kube-scheduler's extender transport keeps 2 idle connections and no TLS session cache, so
    over mTLS concurrent binds pay full handshakes. Setting it is what names the scheduler's identity there: the
    pod's own containers. On the main listener /bind needs server.tls.client_ca_file and a verb_clients CN (it
    fails closed without them)."""
    gc_young_threshold: int = Field(10_000, ge=100, le=1_000_000)
    """Net allocations between two young (generation 0) collections; CPython's default is 700. Every tenth young
    collection also collects generation 1 and every tenth of those may walk the whole heap, so at 700 a 2,000-pod
    burst ran ~780 young, ~70 middle and 6 full collections (1.1 s, ~12 % of the extender's CPU). A young
    collection's work grows with what survives, not with the threshold, so a larger one costs about the same per
    object and runs the full collections ~14x less often; cyclic garbage waits longer to be reclaimed."""
    freeze_heap: bool = True
    """Freeze the start-up heap (``gc.freeze()``) once nodes and pods are listed, so that the garbage collector's
    full collections stop walking the ~160,000 objects the imports leave plus the first lists: they took
    0.18-0.36 s each, every few seconds of a 2,000-pod burst (extender/heap.py). Cyclic garbage among frozen
    objects is never reclaimed; false only to compare. ``qos_extender_gc_pause_seconds`` shows the pauses."""


class KubernetesConfig(Settings):
    """Access to the API server: one list+watch per resource kind, Events, Bindings."""

    kubeconfig: ExistingFile | None = None
    """kubeconfig file; null: $KUBECONFIG, then ~/.kube/config, then the in-cluster service account."""
    context: NonEmpty | None = None
    """kubeconfig context; null: the file's current-context."""
    watch_timeout_seconds: int = Field(300, ge=1, le=3600)
    """Server-side timeout of each watch request; the watch then resumes from the last resourceVersion it saw (a
    410 Gone triggers a fresh list)."""
    backoff_initial_seconds: Seconds = 0.5
    """Reconnect backoff after an API error: exponential with jitter from this ..."""
    backoff_max_seconds: Seconds = 30.0
    """... up to this (>= backoff_initial_seconds)."""
    request_timeout_seconds: Seconds = 30.0
    """Client-side timeout of list and event requests."""
    events: bool = True
    """Emit a Kubernetes Event on a pod whose qos.kube-qos-extender.io/ annotations are malformed (once per pod and
    problem). The pod still gets the documented default."""
    event_component: NonEmpty = "qos-extender"
    """reportingComponent / source.component of those Events."""

    @model_validator(mode="after")
    def _backoff(self) -> KubernetesConfig:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError(
                f"backoff_max_seconds: must be >= backoff_initial_seconds ({self.backoff_initial_seconds})"
            )
        return self


class BindConfig(Settings):
    """The bind verb: POST .../binding with retries inside one budget."""

    timeout_seconds: Seconds = 40.0
    """Total budget of one bind verb, retries included. Must be below server.request_timeout_seconds, itself below
    the scheduler's httpTimeout. Generous on purpose: a bind answered with an Error sends the pod back to
    kube-scheduler's queue, which patches its status, posts an Event and schedules and binds it again, so on a
    loaded API server a short budget turns slow Bindings into a retry storm: at 3 s, 3,039 of 4,755 binds failed in
    a 2,000-pod burst on 500 nodes (issue 17); at 10 s, 5,000 nodes x 10,000 pods collapsed in each of session 22's
    three runs and in one of session 21's two (24,000-68,000 failed binds, 3,000 pods bound in 10 minutes; in one
    run the API server refused 54,000 of kube-scheduler's status PATCHes and Events); at 40 s the same burst bound
    all 10,000 with no failure (issue 34)."""
    attempt_timeout_seconds: Seconds | None = None
    """Timeout of one POST attempt (<= timeout_seconds; null: timeout_seconds). 429, 5xx, connection errors and
    timeouts are retried with exponential backoff until timeout_seconds is spent. It is for a dead connection,
    not a slow server: a POST cut on a loaded API server was mostly applied anyway (issue 17)."""
    backoff_initial_seconds: Seconds = 0.05
    """First retry delay (exponential with jitter)."""
    max_in_flight: int = Field(64, ge=1, le=100_000)
    """Binding POSTs in flight at once; further binds wait in the extender, inside their timeout_seconds, and one
    whose budget runs out while waiting fails definitively (nothing was sent). kube-scheduler calls /bind for every
    pod it scheduled without waiting, and each POST in flight holds an HTTP/1.1 TLS connection to the API server.
    Uncapped, a 10,000-pod burst on 5,000 nodes held thousands at once: the API server spent itself on TLS
    handshakes, no POST was answered within the budget, each bind that timed out was in doubt and its pod
    scheduled again (49,276 failed binds; issue 34). The API server runs only a few dozen requests of one client's
    priority level at a time anyway: more in flight only queue there."""
    ledger_ttl_seconds: Seconds = 30.0
    """A pod we bound keeps occupying its node in filter until the watch shows it or this many seconds pass, so
    two pods are never squeezed into the same space."""
    scheduler_names: tuple[NonEmpty, ...] = ("qos-scheduler",)
    """The spec.schedulerName of the kube-scheduler profiles that call this extender (config/base's profile, and
    hack/local-up.sh's). /bind refuses a pod of any other scheduler, and one already bound elsewhere: a Binding
    from us would bypass that scheduler's own checks. List default-scheduler too only where one kube-scheduler
    sends every profile's pods to the extender (no managedResources)."""

    @property
    def attempt_seconds(self) -> float:
        """The timeout of one attempt (null: the whole budget)."""
        return self.attempt_timeout_seconds if self.attempt_timeout_seconds is not None else self.timeout_seconds

    @model_validator(mode="after")
    def _attempt(self) -> BindConfig:
        if self.attempt_timeout_seconds is not None and self.attempt_timeout_seconds > self.timeout_seconds:
            raise ValueError(f"attempt_timeout_seconds: must be <= timeout_seconds ({self.timeout_seconds})")
        return self


def _extended_resource(name: str) -> str:
    if "/" not in name:
        raise ValueError(f"{name!r} is not an extended resource name (domain/name)")
    return name


class SchedulingConfig(Settings):
    """How pods are placed (papers 000, 004)."""

    profile: Literal["cost", "spread"] = "cost"
    """cost: services by Best Fit Decreasing, batch pods by time-bin BFD (paper 000 Alg. 1-2). spread: services by
    kube-scheduler's LeastAllocated (least requested); batch pods still by time-bin BFD."""
    scaling_cycle_seconds: Seconds = 300.0
    """Scaling cycle sc: the width of a time bin, bin = remaining runtime // sc (paper 000 §5.1: 5 minutes)."""
    managed_resources: tuple[NonEmpty, ...] = ()
    """Extended resources (domain/name) the filter checks exactly, like cpu, memory and pods; others are left to
    kube-scheduler. List the same names in the scheduler's managedResources."""
    marker_resource: NonEmpty | None = MARKER_RESOURCE
    """An extended resource whose only job is to route a pod to this extender: with `managedResources: [{name:
    <marker>, ignoredByScheduler: true}]` on the extender entry, only pods that request it (injected by the QoS
    admission webhook for schedulerName qos-scheduler) reach the extender. Nodes never advertise it: filter
    ignores it (it must not also be in managed_resources). null: none."""

    @field_validator("managed_resources")
    @classmethod
    def _managed(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name in ("cpu", "memory", "pods"):
                raise ValueError(f"{name!r} is always checked; list only extended resources")
            _extended_resource(name)
        if len(set(value)) != len(value):
            raise ValueError("duplicate resource names")
        return value

    @field_validator("marker_resource")
    @classmethod
    def _marker(cls, value: str | None) -> str | None:
        return None if value is None else _extended_resource(value)

    @model_validator(mode="after")
    def _marker_not_managed(self) -> SchedulingConfig:
        if self.marker_resource is not None and self.marker_resource in self.managed_resources:
            raise ValueError(
                f"managed_resources: {self.marker_resource!r} is the marker_resource: nodes never advertise it, "
                "so filter must not check it"
            )
        return self


class PodDefaults(Settings):
    """What a pod without (or with malformed) qos.kube-qos-extender.io/ annotations gets."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    class_name: NonEmpty = Field("bronze", alias="class")
    """Service class when no `class` annotation/label is set (one of `classes`)."""
    class_from_priority: bool = True
    """When no class is set, take the class with the greatest `priority` <= the pod's spec.priority (PriorityClass
    "high" = 1000 gives gold with the default classes); `class` if none qualifies."""
    kind: WorkloadKind = WorkloadKind.SERVICE
    """batch | service, when no `kind` is set."""
    batch_runtime_seconds: NonNegSeconds | None = None
    """Runtime estimate of a batch pod without `runtime-seconds`; null: unknown, it counts as finishing now (time
    bin 0)."""


class LabelSelector(Settings):
    """Every label in match_labels must be present on the node with that value."""

    match_labels: dict[NonEmpty, str] = Field(min_length=1)
    """Must not be empty: an empty selector matches every node."""


class NodeGroupsConfig(Settings):
    """How a node is recognised as a batch or a service node (paper 000 §4). A node matching both selectors
    accepts both kinds."""

    batch: LabelSelector = LabelSelector(match_labels={"qos.kube-qos-extender.io/node-group": "batch"})
    service: LabelSelector = LabelSelector(match_labels={"qos.kube-qos-extender.io/node-group": "service"})
    unlabelled: Literal["any", "batch", "service", "none"] = "any"
    """What a node matching neither selector accepts: any kind, only batch pods, only services, or nothing."""
    enforce: bool = True
    """false: node groups are reported in logs but never reject a node."""
    flavour_label: NonEmpty = "node.kubernetes.io/instance-type"
    """Node label holding the flavour (instance type) name, matched against `flavours`."""

    @property
    def batch_selector(self) -> Mapping[str, str]:
        return self.batch.match_labels

    @property
    def service_selector(self) -> Mapping[str, str]:
        return self.service.match_labels

    @model_validator(mode="after")
    def _distinct(self) -> NodeGroupsConfig:
        if self.batch.match_labels == self.service.match_labels:
            raise ValueError("batch and service selectors are identical: no node could be told apart")
        return self


class QosSettings(Settings):
    """QoS-driven ordering and preemption (paper 002). The anti-thrashing knobs are not in the paper (0 and 0 give
    its exact rule); their defaults were chosen by measurement in the simulator on paper 002's validation 1
    (docs/papers.md): 2,706 preemptions/hour instead of 17,321, bronze min availability 0.4936 instead of 0.4094,
    silver min 0.8976, gold min 0.9994."""

    alpha_seconds: NonNegSeconds = 2.0
    """Expected allocation time alpha, subtracted in Q (paper 002 Eqs. 4, 7)."""
    min_run_quantum_seconds: NonNegSeconds = RECOMMENDED_QUANTUM_SECONDS
    """A running pod whose current run is younger than this is not preempted, except for a more important class
    that is violating its SLO or promises 100 %."""
    q_hysteresis_seconds: NonNegSeconds = RECOMMENDED_HYSTERESIS_SECONDS
    """Between pods of the same class, preemption needs Q_victim > Q_pending + this."""
    overhead_cap: bool = True
    """Refuse same-class preemption of a pod whose preemption overhead exceeds 1 - slo (paper 002 Eq. 8)."""
    relax_by_importance: bool = True
    """Apply the two importance relaxations of paper 002 §3.3.1 below the safety margins."""
    peer_rescue_only: bool = True
    """A pending batch pod with a runtime estimate preempts a pod of its own class only when its Q is below its
    class's safety margin (about to miss its SLO), and such a rescue is not held back by min_run_quantum_seconds;
    false gives paper 002's rule (any peer with a lower Q). Services keep the paper's rule. On Alibaba 2017 the
    paper's rule bounced long tasks for peers that could still wait (issue 33, extender/sim/README.md)."""
    peer_victim_wait_seconds: NonNegSeconds = RECOMMENDED_PEER_VICTIM_WAIT_SECONDS
    """How long a preempted pod expects to wait for room again; a pending service preempts a pod of its own class
    only if that pod keeps Q - this >= its safety margin. The default is two rounds of the autoscaler (its
    lag.default_seconds 120 + scan_interval_seconds 30): set it to your autoscaler's, and to 0 on a cluster that
    does not autoscale (paper 002's rule; its validation 1 runs on fixed nodes). Issue 33, extender/sim/README.md:
    a service waiting for its node took a peer's room, and the peer then waited as long for a node itself."""


class ClassSettings(Settings):
    """A service class (paper 002 §3.1, §4.2)."""

    slo: float = Field(gt=0, le=1.0, allow_inf_nan=False)
    """Availability SLO sigma in (0, 1] (required)."""
    importance: int = Field(ge=1, le=1000)
    """1 = most important (required)."""
    safety_margin_seconds: float = Field(10.0, allow_inf_nan=False)
    """Q below it protects a pod from preemption (paper 002 §3.3.1)."""
    priority: int = Field(0, ge=-(2**31), le=10**9)
    """The PriorityClass value the class corresponds to (pod_defaults.class_from_priority)."""

    def core(self, name: str) -> ServiceClass:
        return ServiceClass(name, self.slo, self.importance, self.safety_margin_seconds, self.priority)


def _class_settings(c: ServiceClass) -> ClassSettings:
    return ClassSettings(
        slo=c.slo, importance=c.importance, safety_margin_seconds=c.safety_margin_seconds, priority=c.priority
    )


# ----------------------------------------------------------------------------------------------- flavours


def _flavour(value: Any) -> Flavour:
    """A flavour from its file form ({name, cpu, memory, pods, price_per_hour}); a Flavour passes as it is."""
    if isinstance(value, Flavour):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping {{name, cpu, memory, pods, price_per_hour}}, got {value!r}")
    known = {"name", "cpu", "memory", "pods", "price_per_hour"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown option")
    missing = [k for k in ("name", "cpu", "memory", "price_per_hour") if k not in value]
    if missing:
        raise ValueError(f"{missing[0]}: is required")
    name, pods, price = value["name"], value.get("pods", 110), value["price_per_hour"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    for key, quantity in (("cpu", value["cpu"]), ("memory", value["memory"])):
        if isinstance(quantity, bool) or not isinstance(quantity, str | int | float):
            raise ValueError(f"{key}: must be a Kubernetes quantity, got {quantity!r}")
    if isinstance(pods, bool) or not isinstance(pods, int) or not 1 <= pods <= 100_000:
        raise ValueError(f"pods: must be an integer between 1 and 100000, got {pods!r}")
    if isinstance(price, bool) or not isinstance(price, int | float) or not 0 < price < float("inf"):
        raise ValueError(f"price_per_hour: must be a finite number > 0, got {price!r}")
    try:
        cpu = cpu_millicores(value["cpu"])
    except InvalidInputError as exc:
        raise ValueError(f"cpu: {exc}") from exc
    try:
        memory = memory_bytes(value["memory"])
    except InvalidInputError as exc:
        raise ValueError(f"memory: {exc}") from exc
    try:
        return Flavour(name, Resources(cpu, memory, pods), float(price))
    except InvalidInputError as exc:
        raise ValueError(str(exc)) from exc


def _flavour_data(f: Flavour) -> dict[str, Any]:
    cpu = f.capacity.cpu_milli
    return {
        "name": f.name,
        "cpu": str(cpu // 1000) if cpu % 1000 == 0 else f"{cpu}m",
        "memory": _memory_text(f.capacity.memory_bytes),
        "pods": f.capacity.pods,
        "price_per_hour": f.price_per_hour,
    }


def _memory_text(n: int) -> str:
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


_FLAVOUR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "cpu", "memory", "price_per_hour"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "cpu": {"type": ["string", "number"], "description": "A Kubernetes cpu quantity."},
        "memory": {"type": ["string", "integer"], "description": "A Kubernetes memory quantity."},
        "pods": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 110},
        "price_per_hour": {"type": "number", "exclusiveMinimum": 0},
    },
}

FlavourField = Annotated[
    Flavour,
    PlainValidator(_flavour),
    PlainSerializer(_flavour_data),
    WithJsonSchema(_FLAVOUR_SCHEMA),
]


def check_catalogue(flavours: tuple[Flavour, ...]) -> tuple[Flavour, ...]:
    names = [f.name for f in flavours]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"duplicate flavour {name!r}")
    return flavours


# A flavour catalogue: duplicate names refused wherever one is read (the extender's `flavours`, parse_flavours).
Catalogue = Annotated[tuple[FlavourField, ...], AfterValidator(check_catalogue)]


def read_catalogue(path: Path) -> tuple[Flavour, ...]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return tuple(_flavour(f) for f in raw.get("flavours", ()))


def parse_flavours(raw: object) -> tuple[Flavour, ...]:
    """A flavour catalogue in its file form (a list of {name, cpu, memory, pods, price_per_hour}); None: empty.
    Every problem of it is named at once."""
    return load_settings(_Catalogue, {"flavours": [] if raw is None else raw}).flavours


# ----------------------------------------------------------------------------------------------- controller


class LeaderElectionConfig(Settings):
    """One replica per controller instance acts (releases, evicts, writes accounts); the others keep a warm
    snapshot and take over through a coordination.k8s.io Lease (client-go's algorithm), rebuilding the accounts
    from the owners' annotations as after a restart."""

    enabled: bool = True
    """Off only where one process is guaranteed (tests, the benchmark's extender)."""
    lease_name: NonEmpty | None = None
    """null: kube-qos-extender-<controller.instance>."""
    lease_namespace: NonEmpty = "kube-system"
    """Where the Lease lives; config/base uses the extender's own namespace, kube-qos-system."""
    identity: NonEmpty | None = None
    """null: $POD_NAME (the Downward API, config/base), else the host name; a restarted container keeps it."""
    lease_duration_seconds: int = Field(15, ge=2, le=3600)
    """A standby takes over at most this long after the leader's last renewal (the Lease holds whole seconds)."""
    renew_deadline_seconds: float = Field(10.0, ge=1, allow_inf_nan=False)
    """The leader stops acting when it could not renew for this long (< lease_duration_seconds)."""
    retry_period_seconds: float = Field(2.0, ge=1, allow_inf_nan=False)
    """How often the leader renews and a standby retries (< renew_deadline_seconds / 1.2)."""

    @model_validator(mode="after")
    def _invariants(self) -> LeaderElectionConfig:
        # client-go's invariants: a renewal must fit in the deadline with jitter, and the deadline must end
        # before another candidate may take the lease.
        if self.lease_duration_seconds <= self.renew_deadline_seconds:
            raise ValueError(
                f"renew_deadline_seconds: must be < lease_duration_seconds ({self.lease_duration_seconds})"
            )
        if self.renew_deadline_seconds <= 1.2 * self.retry_period_seconds:
            limit = self.renew_deadline_seconds / 1.2
            raise ValueError(f"retry_period_seconds: must be < renew_deadline_seconds / 1.2 ({limit:.2f})")
        return self


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


class ControllerConfig(Settings):
    """The QoS controller (paper 002 Algorithm 1 beside kube-scheduler, issue 6): pods of scheduler_name are
    admitted with the scheduling gate gate_name by the mutating webhook POST /admission/mutate
    (config/controller/); the controller releases gates in increasing Q, pins each released pod to the host it
    chose and evicts same-priority victims chosen by the QoS rules (Eviction API, PodDisruptionBudgets honoured).
    Durations are in workload seconds: measured wall-clock durations are multiplied by time_compression before
    the policy sees them, and the controller's own periods (watchdog, gate bound) divided by it."""

    enabled: bool = False
    """false: the admission route still answers (allowing every pod unchanged) but nothing is gated or evicted."""
    watchdog_seconds: Seconds = 10.0
    """Recompute Q and walk the gated pods at least this often (paper 002 §4.1.3: 10 s), and on every pod event."""
    gate_name: NonEmpty = "qos.kube-qos-extender.io/ordering"
    """The scheduling gate (a qualified name, domain/name, owned by this controller)."""
    scheduler_name: NonEmpty = "qos-scheduler"
    """Pods with this spec.schedulerName are gated and accounted; others are left alone."""
    max_gate_seconds: Seconds = 3600.0
    """A gate held longer is released anyway (unpinned) with a Warning Event and counted in
    qos_extender_controller_gate_timeouts_total, so no pod stays gated forever (>= watchdog_seconds)."""
    requeue_pinned_seconds: Seconds = 60.0
    """A released pod pinned to a host that lost its room before kube-scheduler bound it cannot move (its node
    affinity is immutable once ungated). After it was Unschedulable this long with its host still too full (or
    gone), it goes back in the queue: a bare pod is re-created gated and unpinned (same name, spec and
    annotations), an owned pod deleted for its owner to re-create. Event QoSRequeued; retried each period."""
    time_compression: float = Field(1.0, gt=0, le=1000.0, allow_inf_nan=False)
    """Replays compressed in time; 1 in production. Other durations (qos.*, safety margins) stay in workload
    seconds."""
    persistence: Literal["annotation", "memory"] = "annotation"
    """annotation: each request's SLI account is kept in the annotation qos.kube-qos-extender.io/sli on its owner
    (ReplicaSet, Job, StatefulSet, or the bare pod), so a restart rebuilds from it. memory: nothing is written."""
    persist_interval_seconds: Seconds = 60.0
    """Write every account at least this often."""
    persist_min_interval_seconds: NonNegSeconds = 2.0
    """Write one account at most this often (wall seconds): dirty accounts are only delayed, never dropped."""
    release_concurrency: int = Field(48, ge=1, le=1024)
    """Release PATCHes (ungate + pin) and their evictions in flight at once. At 16, releases ran at 40-60 pods/s on
    a loaded API server while kube-scheduler bound up to 190/s (bench/e2e_throughput.py, issue 17)."""
    pin_node: bool = True
    """Pin a released pod to the node the controller chose (required node affinity on metadata.name)."""
    instance: str = "default"
    """Several controllers may share a cluster (a canary, a benchmark): each handles only the pods annotated
    qos.kube-qos-extender.io/controller=<instance> by its own webhook; pods without it belong to "default". A
    lowercase DNS label of at most 40 characters."""
    host_score: Literal["profile", "least-allocated"] = "profile"
    """How the controller picks among the hosts a pod fits on without preemption. profile: the prioritize verb's
    score (scheduling.profile); least-allocated: kube-scheduler's default resource scores (paper 002's
    prototype, the simulator's qos-driven policy)."""
    leader_election: LeaderElectionConfig = LeaderElectionConfig()

    @property
    def lease_name(self) -> str:
        return self.leader_election.lease_name or f"kube-qos-extender-{self.instance}"

    @field_validator("gate_name")
    @classmethod
    def _gate(cls, value: str) -> str:
        if "/" not in value:
            raise ValueError(f"{value!r} must be a qualified name (domain/name) owned by this controller")
        return value

    @field_validator("instance")
    @classmethod
    def _instance(cls, value: str) -> str:
        # it becomes a Lease name suffix, an annotation and a namespace label value
        if not _DNS_LABEL.match(value):
            raise ValueError(f"{value!r} must be a lowercase DNS label of at most 40 characters")
        return value

    @model_validator(mode="after")
    def _gate_bound(self) -> ControllerConfig:
        if self.max_gate_seconds < self.watchdog_seconds:
            raise ValueError(f"max_gate_seconds: must be >= watchdog_seconds ({self.watchdog_seconds})")
        return self


# -------------------------------------------------------------------------------------- slack (co-location)

DEFAULT_PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
DEFAULT_MODEL_PATH = "/var/lib/kube-qos-extender/workload-model.json"
_PROMQL_DURATION = re.compile(r"^[1-9][0-9]*[smh]$")


class CharacteriseSettings(Settings):
    """Paper 004's characterisation: classes per resource (paper: 20), k-means++ seeding runs (best inertia kept),
    interval of the day (must divide 86400), observation time before a new service gets a class (EOT),
    re-clustering cycle and the prediction window of Eq. 3, all in seconds."""

    k: int = Field(20, ge=1, le=1000)
    """Classes per resource (an upper bound: fewer distinct services give fewer classes)."""
    seeds: int = Field(10, ge=1, le=1000)
    """k-means++ seeding runs; the lowest inertia wins."""
    interval_seconds: int = Field(900, ge=1, le=86_400)
    """One interval of the day (must divide 86400)."""
    observation_seconds: Seconds = 86_400.0
    """How long a new service is watched before it is given a class."""
    recluster_seconds: Seconds = 86_400.0
    """The re-clustering cycle."""
    prediction_seconds: Seconds = 900.0
    """The window of Eq. 3's max."""

    def core(self) -> CharacteriseConfig:
        """The core's knobs (seeds 0..n-1)."""
        return CharacteriseConfig(
            k=self.k,
            seeds=tuple(range(self.seeds)),
            interval_seconds=self.interval_seconds,
            observation_seconds=self.observation_seconds,
            recluster_seconds=self.recluster_seconds,
            prediction_seconds=self.prediction_seconds,
        )

    @model_validator(mode="after")
    def _core_accepts(self) -> CharacteriseSettings:
        try:
            self.core()
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from exc
        return self

    @property
    def slots(self) -> int:
        return self.core().slots


class ColocateConfig(Settings):
    """The admission webhook rewrites the cpu/memory requests and limits of pods annotated
    qos.kube-qos-extender.io/colocate: "true" (kind batch, class in `classes`) into batch-cpu/batch-memory, so
    they run on the slack. Another annotation value: a Warning Event, the pod is left as it is."""

    enabled: bool = False
    """Move such pods onto the slack (needs slack.enabled: only the publisher sets the batch resources)."""
    classes: tuple[NonEmpty, ...] = Field(("bronze",), min_length=1)
    """Service classes (of `classes`) whose annotated batch pods are co-located."""


class OwnLevelSettings(Settings):
    """Each service's own recent usage corrects its class prediction (issue 33): the class centre gives the shape
    of the day, the quantile of the service's residuals against it over the last window_seconds is added to the
    class peak, and each node holds back node_sigmas standard deviations of its services' residuals, pooled
    (extender/core/characterise.py OwnLevel). Off: Eq. 3 of paper 004 alone."""

    enabled: bool = True
    """Correct the class prediction by the service's own residuals."""
    window_seconds: Seconds = 7200.0
    """How far back the residuals are read (the latest intervals of the service's profile)."""
    quantile: float = Field(0.5, ge=0.0, le=1.0)
    """The quantile of those residuals added to the class peak (0.5: the service's typical level; 1: the highest
    residual in the window)."""
    node_sigmas: float = Field(1.0, ge=0.0, le=10.0, allow_inf_nan=False)
    """Standard deviations of the node's summed residuals (sqrt of the sum of its services' squared spreads) held
    back from what the node publishes; 0: none."""

    def core(self) -> OwnLevel | None:
        """The core's knobs, None when off."""
        return OwnLevel(self.window_seconds, self.quantile, self.node_sigmas) if self.enabled else None


class SlackConfig(Settings):
    """Batch on the idle capacity of long-running services (paper 004, issue 16): every refresh_seconds the
    controller classifies the running services from their usage in Prometheus, predicts what each will leave idle
    in the next interval (Eq. 3) and publishes each node's sum as the extended resources
    qos.kube-qos-extender.io/batch-cpu and .../batch-memory; batch pods that no longer fit are evicted in QoS
    order. Off by default: it changes what kube-scheduler admits, evicts batch pods on a wrong prediction, and
    needs a Prometheus with the kubelets' usage and nodes/status patch (config/controller)."""

    enabled: bool = False
    """Publish slack and evict on wrong predictions."""
    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    """Prometheus scraping the kubelets' /metrics/resource (or cAdvisor): http:// or https:// URL."""
    rate_window: str = "1m"
    """Rate window of the cpu usage counter (a PromQL duration like 30s, 1m, 5m: at least two scrapes)."""
    model_path: RelativePath = DEFAULT_MODEL_PATH
    """The fitted model, kept across restarts (relative: from the folder of the file that sets it)."""
    refresh_seconds: float = Field(900.0, ge=1.0, allow_inf_nan=False)
    """Publish, check and evict this often; the paper's prediction interval is 15 min."""
    history_seconds: Seconds = 8 * 86_400.0
    """Usage history a (re)fit reads (the paper: 8 days)."""
    classify_seconds: Seconds = 86_400.0
    """Usage read each refresh to classify services (must cover characterise.observation_seconds)."""
    step_seconds: float = Field(60.0, ge=1.0, allow_inf_nan=False)
    """Resolution of those range queries."""
    node_selector: NonEmpty | None = None
    """Label selector of the nodes to publish on; null: every node."""
    evict: bool = True
    """false: prediction misses are counted (qos_extender_slack_prediction_misses_total) but nothing is evicted."""
    miss_tolerance: float = Field(0.05, ge=0.0, le=0.99)
    """A service leaving less idle than predicted by more than this fraction of its request is a miss; its node
    then publishes no more than its real slack until the next refresh."""
    stale_seconds: Seconds = 1800.0
    """Seconds the usage may stay unreadable before every node publishes 0 batch capacity."""
    characterise: CharacteriseSettings = CharacteriseSettings()
    own_level: OwnLevelSettings = OwnLevelSettings()
    colocate: ColocateConfig = ColocateConfig()

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("rate_window")
    @classmethod
    def _window(cls, value: str) -> str:
        # it goes into a PromQL query: nothing but a duration is accepted
        if not _PROMQL_DURATION.match(value):
            raise ValueError(f"must be a duration like 30s, 1m or 5m, got {value!r}")
        return value

    @model_validator(mode="after")
    def _cross(self) -> SlackConfig:
        observation = self.characterise.observation_seconds
        if self.classify_seconds < observation:
            raise ValueError(
                f"classify_seconds: must cover characterise.observation_seconds ({observation}), got "
                f"{self.classify_seconds} (no new service could ever be classified)"
            )
        if self.colocate.enabled and not self.enabled:
            raise ValueError(
                "colocate.enabled: true needs slack.enabled: true (co-located pods request the batch resources"
                " only the slack publisher sets on nodes; without it they would stay Pending)"
            )
        return self


# ---------------------------------------------------------------------------------------------- the file


_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class DisruptionWindow(Settings):
    """A daily UTC window in which a budget applies (Karpenter's schedule + duration, kept small)."""

    start: str = Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
    """Start, HH:MM in UTC."""
    duration_seconds: float = Field(gt=0, le=7 * 86400, allow_inf_nan=False)
    """How long the window stays open from each start (may run past midnight)."""
    weekdays: tuple[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], ...] = ()
    """The days (UTC) a window starts on; empty: every day."""

    def to_core(self) -> Window:
        hours, minutes = self.start.split(":")
        return Window(
            int(hours) * 60 + int(minutes), self.duration_seconds, frozenset(_WEEKDAYS.index(d) for d in self.weekdays)
        )


class DisruptionBudget(Settings):
    """At most max_nodes nodes and max_pods pods of a node group in motion at once by the kinds covered (each
    shell counts what it has in motion: nodes it is emptying, pods it is migrating or evicting)."""

    name: NonEmpty
    """Named in the Events, logs and metrics of what it held."""
    group: Literal["batch", "service"] | None = None
    """The node group it caps; null: each group, counted apart."""
    kinds: tuple[Literal["migration", "preemption", "consolidation", "slack-eviction"], ...] = ()
    """The disruptions it covers; empty: all (migration, preemption, consolidation, slack-eviction)."""
    max_nodes: int | None = Field(None, ge=0)
    """Distinct nodes in motion at once; 0: none (e.g. inside a window); null: no cap."""
    max_pods: int | None = Field(None, ge=0)
    """Pods in motion at once; null: no cap."""
    windows: tuple[DisruptionWindow, ...] = ()
    """When the budget applies; empty: always. Outside its windows a budget caps nothing."""

    def to_core(self) -> Budget:
        return Budget(
            self.name,
            self.group,
            frozenset(DisruptionKind(k) for k in self.kinds),
            self.max_nodes,
            self.max_pods,
            tuple(w.to_core() for w in self.windows),
        )


class DisruptionSettings(Settings):
    """Guard rails for every disruption the product makes (issue 32 part 4): QoS preemptions (the QoS
    controller), slack evictions (the idle-capacity controller), node consolidations and their migrations (the
    autoscaler's consolidation flow, which reads this section from the extender file it is given)."""

    budgets: tuple[DisruptionBudget, ...] = ()
    """Disruption budgets; empty (default): nothing capped beyond each component's own pace. A disruption waits
    while a budget that applies now would be exceeded (Event QosDisruptionWaiting naming the budget, metric
    decision="waited")."""
    dry_run: bool = False
    """Report each preemption, eviction, consolidation and migration that would be made (Event
    QosDisruptionDryRun on the pod or node, metric qos_extender_<component>_disruptions_total{kind,
    decision="dry_run"} of the controller, slack or consolidation) and make none: no cordon, no checkpoint, no
    eviction, no gate released for a preemption."""
    honour_pdbs_for_migrations: bool = True
    """A migration deletes its source pod: before it starts, ask the API (an Eviction with dryRun=All) whether the
    pod's PodDisruptionBudgets allow that, and wait while they do not."""
    pdb_wait_seconds: NonNegSeconds = 300.0
    """How long a migration waits for its PodDisruptionBudget; then its node's consolidation is aborted."""
    report_interval_seconds: NonNegSeconds = 300.0
    """A dry-run report or a wait is said (Event) at most once per disruption in this period."""

    @model_validator(mode="after")
    def _unique_names(self) -> DisruptionSettings:
        names = [b.name for b in self.budgets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"budget names must be unique: {', '.join(dup)}")
        return self

    @property
    def core_budgets(self) -> tuple[Budget, ...]:
        return tuple(b.to_core() for b in self.budgets)


class LoggingConfig(Settings):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Logs are JSON lines on stderr."""


class _Catalogue(Settings):
    flavours: Catalogue = ()


DEFAULT_CLASS_SETTINGS: Mapping[str, ClassSettings] = {name: _class_settings(c) for name, c in DEFAULT_CLASSES.items()}


class PlacementSettings(Protocol):
    """What the verbs read of the settings: placement, pod defaults, node groups and the QoS policy."""

    @property
    def scheduling(self) -> SchedulingConfig: ...
    @property
    def pod_defaults(self) -> PodDefaults: ...
    @property
    def node_groups(self) -> NodeGroupsConfig: ...
    @property
    def policy(self) -> QosPolicy: ...


class SnapshotSettings(PlacementSettings, Protocol):
    """What the cluster snapshot reads: the verbs' view and the bind ledger's lifetime."""

    @property
    def bind(self) -> BindConfig: ...
