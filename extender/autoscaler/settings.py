"""Settings of `qos-extender autoscaler`: its own strict YAML file beside the extender's (--config), on the typed
settings base (extender.settings): unknown keys, wrong types and out-of-range values are refused, every error of
the file at once, naming each option. Every option with its default and its meaning: docs/settings/autoscaler.yaml
(generated from these models). A catalogue no plan can come from (empty, a zero price, duplicate names) stops the
process too -- never a silent default, never an endless scale-up.

The extender file (``--config``) still supplies what both share: Kubernetes access, node-group selectors,
pod defaults and classes, the batch cycle's default and the flavour catalogue (``flavours``; may be overridden at
the top of this file).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from extender.core.autoscale import ScoreWeights, validate_catalogue
from extender.core.model import Flavour, InvalidInputError, NodeGroup, Resources, cpu_millicores, memory_bytes
from extender.settings import ExistingFile, Settings, SettingsError, load_settings, read_yaml
from extender.settings.extender import ExtenderConfig, parse_flavours
from extender.settings.sections import METRICS_CLIENT_CN, LeaderElectionConfig, NonEmpty

__all__ = [
    "AutoscalerSettings",
    "CaExpanderSettings",
    "CloudProviderSettings",
    "LagDistribution",
    "ProvisioningRequestSettings",
    "load_autoscaler_config",
    "parse_autoscaler_config",
]

PROVREQ_CLASSES = ("best-effort-atomic-scale-up.autoscaling.x-k8s.io",)
_DNS_ISH = "lowercase letters, digits and '-'"
# gRPC receive limits (bench/ca_message_sizes.py measured the requests of the real cluster-autoscaler 1.35.2;
# the numbers and the margin are in extender/autoscaler/README.md, "Message sizes")
EXPANDER_MAX_MESSAGE_BYTES = 64 * 2**20
CLOUD_PROVIDER_MAX_MESSAGE_BYTES = 4 * 2**20
CA_CLIENT_CN = "cluster-autoscaler"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _prefix(value: str) -> str:
    if not value.replace("-", "").isalnum() or value != value.lower() or len(value) > 40:
        raise ValueError(f"must be {_DNS_ISH} (<= 40), got {value!r}")
    return value


def _listen(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be host:port, got {value!r}")
    return value


class LagDistribution(Settings):
    """Acquisition lag of the kwok provider (the stand-in for a cloud's boot time), in seconds. fixed: seconds;
    uniform: [min, max]; normal: mean seconds, sd, clipped at min; lognormal: median seconds, shape sigma.
    Paper 001 measured GKE at mean 157.4 s, sd 4.2 s."""

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    distribution: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    seconds: float = Field(30.0, ge=0, allow_inf_nan=False)
    minimum: float = Field(0.0, ge=0, allow_inf_nan=False, alias="min")
    maximum: float | None = Field(None, ge=0, allow_inf_nan=False, alias="max")
    """uniform's upper bound; null: max(seconds, min)."""
    sd: float = Field(0.0, ge=0, allow_inf_nan=False)
    sigma: float = Field(0.0, ge=0, allow_inf_nan=False)
    seed: int | None = None
    """Seed of the draws; null: a fresh one each start."""

    @model_validator(mode="after")
    def _bounds(self) -> LagDistribution:
        if self.maximum is None:
            object.__setattr__(self, "maximum", max(self.seconds, self.minimum))
        elif self.distribution == "uniform" and self.maximum < self.minimum:
            raise ValueError(f"max: must be >= min ({self.minimum}), got {self.maximum}")
        return self

    @property
    def upper(self) -> float:
        return self.maximum if self.maximum is not None else max(self.seconds, self.minimum)


class CloudProviderSettings(Settings):
    """The externalgrpc cloud provider cluster-autoscaler calls with --cloud-provider=externalgrpc (mTLS). Node
    groups = groups x the flavour catalogue, each between min_size and max_size nodes; new nodes come from backend
    (kwok: the local stand-in for a cloud API). node_group_options: answer NodeGroupGetOptions with CA's defaults
    but our idle period and provisioning timeout (false: UNIMPLEMENTED, CA keeps its flags)."""

    cert_file: ExistingFile
    """Server certificate CA's cloud-config cacert trusts (cluster-autoscaler's externalgrpc provider speaks mTLS)."""
    key_file: ExistingFile
    """The key of cert_file."""
    client_ca_file: ExistingFile
    """The CA that signed CA's client certificate (cloud-config cert)."""
    listen: str = "127.0.0.1:8086"
    """host:port to serve on."""
    backend: Literal["kwok"] = "kwok"
    groups: tuple[NodeGroup, ...] = Field((NodeGroup.SERVICE, NodeGroup.BATCH), min_length=1)
    """Node groups offered (each x every flavour), distinct."""
    min_size: int = Field(0, ge=0, le=10_000)
    max_size: int = Field(10, ge=1, le=10_000)
    node_name_prefix: str = "qos-ca"
    gpu_label: str = Field("qos.kube-qos-extender.io/accelerator", min_length=1)
    node_group_options: bool = False
    clients: tuple[NonEmpty, ...] = Field((CA_CLIENT_CN,), min_length=1)
    """Identities allowed to call (any of the client certificate's subject CN or SAN entries): cluster-autoscaler's
    client certificate (cloud-config cert). Any other certificate of client_ca_file gets PERMISSION_DENIED,
    counted in qos_extender_autoscaler_refused_calls_total{reason="permission_denied"}."""
    max_message_bytes: int = Field(CLOUD_PROVIDER_MAX_MESSAGE_BYTES, ge=64 * 1024, le=2**31 - 1)
    """Largest request accepted, in bytes; larger ones get RESOURCE_EXHAUSTED, counted (reason too_large). CA's
    requests here carry one object each: 680 B at most with 5,000 nodes (NodeGroupForNode), so gRPC's own 4 MiB
    stays, now counted (extender/autoscaler/README.md, "Message sizes")."""

    _v_listen = field_validator("listen")(classmethod(lambda cls, v: _listen(v)))
    _v_prefix = field_validator("node_name_prefix")(classmethod(lambda cls, v: _prefix(v)))

    @model_validator(mode="after")
    def _check(self) -> CloudProviderSettings:
        if len(set(self.groups)) != len(self.groups):
            raise ValueError(f"groups: must be distinct, got {[g.value for g in self.groups]}")
        if self.max_size < self.min_size:
            raise ValueError(f"max_size: must be >= min_size ({self.min_size}), got {self.max_size}")
        # read the PEM files now: a wrong file is an error at start, not a failed handshake later
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"cert_file: with key_file, not a matching PEM certificate and key ({exc})") from exc
        try:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"client_ca_file: not a PEM CA bundle ({exc})") from exc
        return self


class NodeReserve(Settings):
    """Room each planned node keeps free besides the DaemonSet pods the sidecar sees on nodes of the group: what
    CA's node templates hold before any pod (the kwok and GCE providers add a 100m kube-proxy pod)."""

    cpu: str | int | float = "100m"
    """A Kubernetes cpu quantity."""
    memory: str | int = 0
    """A Kubernetes memory quantity."""

    @model_validator(mode="after")
    def _quantities(self) -> NodeReserve:
        try:
            self.resources()
        except (InvalidInputError, ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from exc
        return self

    def resources(self) -> Resources:
        return Resources(cpu_millicores(self.cpu), memory_bytes(self.memory), 0)


class ProvisioningRequestSettings(Settings):
    """Demand handed to cluster-autoscaler as ProvisioningRequests (providers/provisioning_request.py): the
    namespace where the requests and their PodTemplates live (the sidecar's own), and the class CA runs them with.
    CA needs --enable-provisioning-requests and the CRD (README.md, "cluster-autoscaler"). Disabled: the sidecar
    only answers CA's expander (plans as metrics); gated qos pods then never reach CA."""

    enabled: bool = True
    namespace: str = Field("kube-qos-system", min_length=1, max_length=63)
    """Namespace of the requests and their PodTemplates."""
    class_name: Literal["best-effort-atomic-scale-up.autoscaling.x-k8s.io"] = (
        "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    )
    """check-capacity never buys (it only simulates against existing nodes): not a way to hand demand over."""
    delivered_grace_seconds: float = Field(300.0, ge=1.0, le=86_400.0)
    """After CA marked a request Provisioned, pods of it still waiting this long are planned again: the nodes joined
    and pods released earlier in Q order took their room (cover a cloud's node boot time)."""
    node_reserve: NodeReserve = NodeReserve()
    gated_demand_seconds: float = Field(5.0, ge=0.0, le=3600.0)
    """A pod the QoS controller kept gated this long (and that fits no node now) is demand handed to CA."""

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not value.replace("-", "").isalnum() or value != value.lower():
            raise ValueError(f"must be a namespace name ({_DNS_ISH}), got {value!r}")
        return value


class CaExpanderSettings(Settings):
    """The gRPC expander server cluster-autoscaler calls with --expander=grpc (TLS is mandatory there), the optional
    externalgrpc cloud provider, and demand handed over as ProvisioningRequests."""

    listen: str = "127.0.0.1:7000"
    """host:port to serve the expander on."""
    cert_file: ExistingFile | None = None
    """Serving certificate (required with provider cluster-autoscaler)."""
    key_file: ExistingFile | None = None
    """Its key."""
    cloud_provider: CloudProviderSettings | None = None
    """Serve CA's externalgrpc cloud provider too; null: not served."""
    provisioning_requests: ProvisioningRequestSettings = ProvisioningRequestSettings()
    max_message_bytes: int = Field(EXPANDER_MAX_MESSAGE_BYTES, ge=64 * 1024, le=2**31 - 1)
    """Largest BestOptions request accepted, in bytes; larger ones get RESOURCE_EXHAUSTED, counted in
    qos_extender_autoscaler_refused_calls_total{reason="too_large"} (CA then keeps its own options). CA sends every
    option's pods (~1.2 KB each, in each option) and every node group's template: 6.1 MiB measured on a 5,000-node
    cluster, ~37 MB for 5,000 pods in 6 options; 64 MiB is 10x / 1.7x that (extender/autoscaler/README.md,
    "Message sizes")."""

    _v_listen = field_validator("listen")(classmethod(lambda cls, v: _listen(v)))

    @model_validator(mode="after")
    def _check(self) -> CaExpanderSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        if (
            self.cloud_provider is not None
            and self.cloud_provider.listen == self.listen
            and not self.listen.endswith(":0")  # port 0: each gets a free port of its own
        ):
            raise ValueError(f"cloud_provider.listen: must differ from listen ({self.listen})")
        return self

    @property
    def provreq(self) -> ProvisioningRequestSettings | None:
        """The ProvisioningRequest settings when enabled, else None."""
        return self.provisioning_requests if self.provisioning_requests.enabled else None


class ScoreWeightsSettings(Settings):
    """w1 / w2 of the cost-efficiency score nc (paper 000: 0.5 / 0.5; paper 004: 0.38 / 0.62); only the ratio
    matters."""

    cpu: float = Field(0.5, ge=0, allow_inf_nan=False)
    memory: float = Field(0.5, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _not_both_zero(self) -> ScoreWeightsSettings:
        if self.cpu + self.memory <= 0:
            raise ValueError("score weights must not both be zero")
        return self

    def core(self) -> ScoreWeights:
        return ScoreWeights(self.cpu, self.memory)


class LagSettings(Settings):
    """The node acquisition lag the planner expects: measured from the nodes it bought, the quantile of the last
    window joins; default_seconds until there is one."""

    default_seconds: float = Field(120.0, ge=0, allow_inf_nan=False)
    window: int = Field(20, ge=1, le=10_000)
    quantile: float = Field(0.9, gt=0, le=1.0)


class LimitsSettings(Settings):
    """Bounds on what the sidecar buys."""

    max_nodes_per_cycle: int = Field(50, ge=1, le=10_000)
    """Nodes bought in one scan, at most."""
    max_nodes: int = Field(200, ge=1, le=100_000)
    """Nodes provisioned by us (joined + being provisioned), at most."""
    retire_drain_seconds: float = Field(3600.0, ge=0, allow_inf_nan=False)
    """A node is cordoned for capacity only if its pods end within this; 0: never."""
    max_attempts_per_pod: int = Field(3, ge=1, le=1000)
    """Nodes bought for one pod that still does not schedule, then an Event and stop."""


class MetricsSettings(Settings):
    """The sidecar's /metrics, /healthz and /readyz listener. With cert_file it speaks HTTPS: /metrics only for a
    client certificate signed by client_ca_file whose CN or a SAN is in clients (403 otherwise, counted), the probes
    without one (kubelet presents none). Without cert_file it serves plain HTTP, on a loopback host only."""

    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(8890, ge=0, le=65535)
    cert_file: ExistingFile | None = None
    """PEM serving certificate (reloaded when the file changes)."""
    key_file: ExistingFile | None = None
    """Its key."""
    client_ca_file: ExistingFile | None = None
    """PEM bundle of the CA(s) that sign the scraper's client certificate (required with cert_file)."""
    clients: tuple[NonEmpty, ...] = (METRICS_CLIENT_CN,)
    """Identities (client certificate subject CN or SAN) allowed on GET /metrics: Prometheus' scrape certificate."""
    reload_seconds: float = Field(30.0, ge=1.0, le=3600.0)
    """How often the certificate files are checked for a change."""

    @model_validator(mode="after")
    def _tls(self) -> MetricsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        if self.cert_file is not None and self.client_ca_file is None:
            raise ValueError("client_ca_file: required with cert_file (/metrics answers only allowed scrapers)")
        if self.cert_file is None and self.host not in _LOOPBACK:
            raise ValueError(
                f"host: {self.host!r} without TLS: plain HTTP only on a loopback host; set cert_file, key_file and "
                "client_ca_file to serve on another address"
            )
        return self


class AutoscalerLeaderElection(LeaderElectionConfig):
    """Only the holder of the Lease scans, buys, removes, hands nodes to consolidation and writes Events; the
    other replicas keep their snapshot warm and serve /metrics, /healthz, /readyz and the gRPC expander's
    answers (extender/controller/leader.py: every Lease call bounded, the leader stops acting renew_deadline
    after its last renewal was sent, before a standby may take over)."""

    lease_name: NonEmpty = "qos-autoscaler"
    """The Lease's name (in lease_namespace)."""
    lease_namespace: NonEmpty | None = None  # type: ignore[assignment]
    """null: the namespace the pod runs in ($POD_NAMESPACE, else its service account's), else kube-system (a
    process outside a cluster)."""


class KwokSettings(Settings):
    """The kwok provider (the local stand-in for a cloud API)."""

    lag: LagDistribution = LagDistribution()


class AutoscalerSettings(Settings):
    """`qos-extender autoscaler`: the sidecar that expands (and shrinks) the cluster with a cost-efficient mix of
    node flavours, by itself (provider kwok) or through the cluster-autoscaler users run (provider
    cluster-autoscaler)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scheduler_names: tuple[str, ...] = Field(("qos-scheduler",), min_length=1)
    """Pods of these schedulers are the demand."""
    provider: Literal["kwok", "cluster-autoscaler"] = "kwok"
    """Who buys nodes: kwok (the sidecar, local stand-in for a cloud) or cluster-autoscaler."""
    dry_run: bool = False
    """Plan and report, buy and remove nothing."""
    scan_interval_seconds: float = Field(30.0, gt=0, allow_inf_nan=False)
    """Service group (and every other check) at least this often."""
    batch_cycle_seconds: float = Field(300.0, gt=0, allow_inf_nan=False)
    """Batch-group scale-up cycle (paper 000 Table 6); unset: the extender's scheduling.scaling_cycle_seconds."""
    burst_debounce_seconds: float = Field(2.0, ge=0, allow_inf_nan=False)
    """A new unschedulable pod wakes the loop after this."""
    idle_seconds: float = Field(300.0, ge=0, allow_inf_nan=False)
    """Empty nodes go after this (paper 004)."""
    provisioning_timeout_seconds: float = Field(900.0, gt=0, allow_inf_nan=False)
    """A node not joined by then is given up."""
    underutil_threshold: float = Field(0.5, gt=0, le=1.0)
    """A batch node below this utilisation is a consolidation candidate (paper 000 Alg. 5: 50 %)."""
    underutil_sustain_seconds: float = Field(30.0, ge=0, allow_inf_nan=False)
    """... for this long."""
    batch_queue_quiet_seconds: float = Field(30.0, ge=0, allow_inf_nan=False)
    """... while no batch pod waited for this long."""
    score_weights: ScoreWeightsSettings = ScoreWeightsSettings()
    lag: LagSettings = LagSettings()
    limits: LimitsSettings = LimitsSettings()
    node_name_prefix: str = "qos-as"
    """Names of the nodes the sidecar buys."""
    scale_down_provisioned_only: bool = True
    """Only nodes labelled provisioned-by=qos-autoscaler are removed when idle."""
    metrics: MetricsSettings = MetricsSettings()
    kwok: KwokSettings = KwokSettings()
    cluster_autoscaler: CaExpanderSettings = CaExpanderSettings()
    leader_election: AutoscalerLeaderElection = AutoscalerLeaderElection()
    flavours: SkipJsonSchema[tuple[Flavour, ...]] = Field((), exclude=True)
    """Set by the loader from the file's top-level flavours, else the extender's (not an option of this section)."""

    _v_prefix = field_validator("node_name_prefix")(classmethod(lambda cls, v: _prefix(v)))

    @field_validator("flavours", mode="before")
    @classmethod
    def _flavours_not_here(cls, value: Any, info: ValidationInfo) -> Any:
        # the default () passes; from a file (a JSON array) never: the catalogue is set beside autoscaler:
        if (info.mode == "json" and not isinstance(value, tuple)) or not all(isinstance(f, Flavour) for f in value):
            raise ValueError("set at the top level of the file (beside autoscaler:), not in it")
        return tuple(value or ())

    @model_validator(mode="after")
    def _check(self) -> AutoscalerSettings:
        if self.provider == "cluster-autoscaler" and self.cluster_autoscaler.cert_file is None:
            raise ValueError(
                "cluster_autoscaler.cert_file: required with provider cluster-autoscaler "
                "(CA's gRPC expander refuses insecure connections)"
            )
        if self.cluster_autoscaler.cloud_provider is not None and self.provider != "cluster-autoscaler":
            raise ValueError(
                f"cluster_autoscaler.cloud_provider: only with provider cluster-autoscaler (got {self.provider!r}): "
                "with the kwok provider the sidecar buys the nodes itself"
            )
        return self

    # The loop's names for the sections (read-only views, not options of their own).
    @property
    def weights(self) -> ScoreWeights:
        return self.score_weights.core()

    @property
    def lag_default_seconds(self) -> float:
        return self.lag.default_seconds

    @property
    def lag_window(self) -> int:
        return self.lag.window

    @property
    def lag_quantile(self) -> float:
        return self.lag.quantile

    @property
    def max_nodes_per_cycle(self) -> int:
        return self.limits.max_nodes_per_cycle

    @property
    def max_nodes(self) -> int:
        return self.limits.max_nodes

    @property
    def retire_drain_seconds(self) -> float:
        return self.limits.retire_drain_seconds

    @property
    def max_attempts_per_pod(self) -> int:
        return self.limits.max_attempts_per_pod

    @property
    def metrics_host(self) -> str:
        return self.metrics.host

    @property
    def metrics_port(self) -> int:
        return self.metrics.port

    @property
    def kwok_lag(self) -> LagDistribution:
        return self.kwok.lag

    @property
    def expander(self) -> CaExpanderSettings:
        return self.cluster_autoscaler


def parse_autoscaler_config(raw: object, extender: ExtenderConfig, base: Path | None = None) -> AutoscalerSettings:
    """Validate the autoscaler document ({autoscaler: {...}, flavours: [...]}); the flavour catalogue comes from it
    or from the extender file, the batch cycle's default from the extender's scheduling.scaling_cycle_seconds."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SettingsError("", [("", f"must be a mapping, got {type(raw).__name__}")])
    unknown = sorted(str(k) for k in raw if k not in ("autoscaler", "flavours"))
    if unknown:
        raise SettingsError("", [(k, "unknown option (known: autoscaler, flavours)") for k in unknown])
    section = raw.get("autoscaler") or {}
    settings = load_settings(AutoscalerSettings, section, prefix="autoscaler", base=base)
    if "batch_cycle_seconds" not in settings.model_fields_set:
        settings = settings.model_copy(update={"batch_cycle_seconds": extender.scheduling.scaling_cycle_seconds})
    flavours = parse_flavours(raw["flavours"]) if "flavours" in raw else extender.flavours
    try:
        validate_catalogue(flavours)
    except InvalidInputError as exc:
        raise SettingsError("", [("flavours", f"{exc} (set `flavours` here or in the extender config)")]) from exc
    return settings.model_copy(update={"flavours": tuple(flavours)})


def load_autoscaler_config(path: str | Path | None, extender: ExtenderConfig) -> AutoscalerSettings:
    """Read the file at ``path`` (None: every default, the catalogue from the extender's file)."""
    if path is None:
        return parse_autoscaler_config({}, extender)
    p = Path(path)
    raw = read_yaml(p)
    try:
        return parse_autoscaler_config(raw, extender, base=p.resolve().parent)
    except SettingsError as exc:
        raise SettingsError(str(p), exc.problems) from None
