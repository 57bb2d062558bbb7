"""Configuration of `qos-extender autoscaler`: its own strict YAML file beside config/extender.yaml.

The extender file (``--config``) still supplies what both share: Kubernetes access, node-group selectors,
pod defaults and classes, and the flavour catalogue (``flavours``; may be overridden here). Everything the
sidecar alone decides is in this file; ``extender/autoscaler/autoscaler.yaml`` is the documented default.
Loading is as strict as the extender's: unknown keys, wrong types, out-of-range values and a catalogue no
plan can come from (empty, a zero price, duplicate names) stop the process with a message naming the
option -- never a silent default, never an endless scale-up.
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.config import (
    ConfigError,
    ExtenderConfig,
    load_yaml_config,
    parse_flavours,
    read_bool,
    read_file_path,
    read_int,
    read_number,
    read_req_str,
    section,
)
from extender.core.autoscale import ScoreWeights, validate_catalogue
from extender.core.model import Flavour, InvalidInputError, NodeGroup, Resources, cpu_millicores, memory_bytes

__all__ = [
    "DEFAULT_AUTOSCALER_CONFIG",
    "AutoscalerSettings",
    "CaExpanderSettings",
    "CloudProviderSettings",
    "LagDistribution",
    "load_autoscaler_config",
    "parse_autoscaler_config",
]

DEFAULT_AUTOSCALER_CONFIG = Path(__file__).resolve().parent / "autoscaler.yaml"
PROVIDERS = ("kwok", "cluster-autoscaler")
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
BACKENDS = ("kwok",)


@dataclass(frozen=True, slots=True)
class LagDistribution:
    """Acquisition lag of the kwok provider (the stand-in for a cloud's boot time), in seconds.

    fixed: ``seconds``; uniform: [min, max]; normal: mean ``seconds``, ``sd``, clipped at ``min``;
    lognormal: median ``seconds``, shape ``sigma``. Paper 001 measured GKE at mean 157.4 s, sd 4.2 s.
    """

    distribution: str = "fixed"
    seconds: float = 30.0
    minimum: float = 0.0
    maximum: float = 0.0
    sd: float = 0.0
    sigma: float = 0.0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class CloudProviderSettings:
    """The externalgrpc cloud provider cluster-autoscaler calls with --cloud-provider=externalgrpc (mTLS).

    Node groups = ``groups`` x the flavour catalogue, each between ``min_size`` and ``max_size`` nodes; new nodes
    come from ``backend`` (kwok: the local stand-in for a cloud API). ``node_group_options``: answer
    NodeGroupGetOptions with CA's defaults but our idle period and provisioning timeout (false: UNIMPLEMENTED, CA
    keeps its flags)."""

    cert_file: str
    key_file: str
    client_ca_file: str
    listen: str = "127.0.0.1:8086"
    backend: str = "kwok"
    groups: tuple[NodeGroup, ...] = (NodeGroup.SERVICE, NodeGroup.BATCH)
    min_size: int = 0
    max_size: int = 10
    node_name_prefix: str = "qos-ca"
    gpu_label: str = "qos.kube-qos-extender.io/accelerator"
    node_group_options: bool = False


@dataclass(frozen=True, slots=True)
class ProvisioningRequestSettings:
    """Demand handed to cluster-autoscaler as ProvisioningRequests (providers/provisioning_request.py): the
    namespace where the requests and their PodTemplates live (the sidecar's own), and the class CA runs them with.
    CA needs ``--enable-provisioning-requests`` and the CRD (config/cluster-autoscaler/README.md)."""

    namespace: str = "kube-qos-system"
    class_name: str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    # after CA marked a request Provisioned, pods of it still waiting this long are planned again: the nodes
    # joined and pods released earlier in Q order took their room (cover a cloud's node boot time)
    delivered_grace_seconds: float = 300.0
    # room each planned node keeps free besides the DaemonSet pods the sidecar sees on nodes of the group: what
    # CA's node templates hold before any pod (the kwok and GCE providers add a 100m kube-proxy pod)
    node_reserve: Resources = field(default_factory=lambda: Resources(100, 0, 0))
    # a pod the QoS controller kept gated this long (and that fits no node now) is demand handed to CA. Shorter than
    # the kwok mode's 15 s (view.GATED_DEMAND_SECONDS, the simulator's): while qos demand is hidden, CA buys for
    # other pending pods of the group and released qos pods take those nodes, so CA buys again
    gated_demand_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class CaExpanderSettings:
    """The gRPC expander server cluster-autoscaler calls with --expander=grpc (TLS is mandatory there), and the
    optional externalgrpc cloud provider (``cloud_provider``; None: not served)."""

    listen: str = "127.0.0.1:7000"
    cert_file: str | None = None
    key_file: str | None = None
    cloud_provider: CloudProviderSettings | None = None
    # None: the sidecar only answers CA's expander (plans as metrics); gated qos pods then never reach CA
    provisioning_requests: ProvisioningRequestSettings | None = field(default_factory=ProvisioningRequestSettings)


@dataclass(frozen=True, slots=True)
class AutoscalerSettings:
    scheduler_names: tuple[str, ...] = ("qos-scheduler",)
    provider: str = "kwok"
    dry_run: bool = False
    scan_interval_seconds: float = 30.0  # service group (and every other check) at least this often
    batch_cycle_seconds: float = 300.0  # paper 000 Table 6: batch-group scale-up cycle
    burst_debounce_seconds: float = 2.0  # a new unschedulable pod wakes the loop after this
    idle_seconds: float = 300.0  # paper 004: empty nodes go after this
    provisioning_timeout_seconds: float = 900.0
    underutil_threshold: float = 0.5
    underutil_sustain_seconds: float = 30.0  # two scans in a row (extender/sim/README.md: the product figures)
    batch_queue_quiet_seconds: float = 30.0
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    lag_default_seconds: float = 120.0
    lag_window: int = 20
    lag_quantile: float = 0.9
    max_nodes_per_cycle: int = 50
    max_nodes: int = 200
    # a node is cordoned for capacity (core.autoscale_scan.retire_for_cap) only if its pods end within this; 0: never
    retire_drain_seconds: float = 3600.0
    max_attempts_per_pod: int = 3
    node_name_prefix: str = "qos-as"
    scale_down_provisioned_only: bool = True
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8890
    flavours: tuple[Flavour, ...] = ()
    kwok_lag: LagDistribution = field(default_factory=LagDistribution)
    expander: CaExpanderSettings = field(default_factory=CaExpanderSettings)


def _names(raw: dict[str, Any], key: str, path: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = raw.get(key, list(default))
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{path}.{key}: must be a non-empty list of names, got {value!r}")
    return tuple(value)


def _parse_lag(raw: object, path: str) -> LagDistribution:
    s = section(raw, path, {"distribution", "seconds", "min", "max", "sd", "sigma", "seed"})
    dist = read_req_str(s, "distribution", path, "fixed", choices=DISTRIBUTIONS)
    seconds = read_number(s, "seconds", path, 30.0, minimum=0)
    minimum = read_number(s, "min", path, 0.0, minimum=0)
    maximum = read_number(s, "max", path, max(seconds, minimum), minimum=0)
    if dist == "uniform" and maximum < minimum:
        raise ConfigError(f"{path}.max: must be >= min ({minimum}), got {maximum}")
    seed = s.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"{path}.seed: must be an integer, got {seed!r}")
    return LagDistribution(
        distribution=dist,
        seconds=seconds,
        minimum=minimum,
        maximum=maximum,
        sd=read_number(s, "sd", path, 0.0, minimum=0),
        sigma=read_number(s, "sigma", path, 0.0, minimum=0),
        seed=seed,
    )


def _listen(s: dict[str, Any], path: str, default: str) -> str:
    listen = read_req_str(s, "listen", path, default)
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{path}.listen: must be host:port, got {listen!r}")
    return listen


def _required_file(s: dict[str, Any], key: str, path: str, base: Path | None, why: str) -> str:
    value = read_file_path(s, key, path, base)
    if value is None:
        raise ConfigError(f"{path}.{key}: required ({why})")
    return value


def _check_tls(cert: str, key: str, client_ca: str, path: str) -> None:
    """Read the PEM files now, so a wrong file is a config error at start, not a failed handshake later."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{path}.cert_file / key_file: not a matching PEM certificate and key ({exc})") from exc
    try:
        ctx.load_verify_locations(cafile=client_ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{path}.client_ca_file: not a PEM CA bundle ({exc})") from exc


CLOUD_PROVIDER = {
    "listen",
    "cert_file",
    "key_file",
    "client_ca_file",
    "backend",
    "groups",
    "min_size",
    "max_size",
    "node_name_prefix",
    "gpu_label",
    "node_group_options",
}


def _parse_cloud_provider(raw: object, path: str, base: Path | None) -> CloudProviderSettings:
    s = section(raw, path, CLOUD_PROVIDER)
    why = "cluster-autoscaler's externalgrpc provider speaks mTLS"
    cert = _required_file(s, "cert_file", path, base, f"{why}: the server certificate CA's cloud-config cacert trusts")
    key = _required_file(s, "key_file", path, base, f"{why}: the key of cert_file")
    client_ca = _required_file(
        s, "client_ca_file", path, base, f"{why}: the CA that signed CA's client certificate (cloud-config cert)"
    )
    _check_tls(cert, key, client_ca, path)
    groups_raw = s.get("groups", ["service", "batch"])
    names = [g.value for g in NodeGroup]
    if (
        not isinstance(groups_raw, list)
        or not groups_raw
        or not all(isinstance(g, str) and g in names for g in groups_raw)
        or len(set(groups_raw)) != len(groups_raw)
    ):
        raise ConfigError(
            f"{path}.groups: must be a non-empty list of distinct {' / '.join(names)}, got {groups_raw!r}"
        )
    min_size = read_int(s, "min_size", path, 0, minimum=0, maximum=10_000)
    max_size = read_int(s, "max_size", path, 10, minimum=1, maximum=10_000)
    if max_size < min_size:
        raise ConfigError(f"{path}.max_size: must be >= min_size ({min_size}), got {max_size}")
    prefix = read_req_str(s, "node_name_prefix", path, "qos-ca")
    if not prefix.replace("-", "").isalnum() or prefix != prefix.lower() or len(prefix) > 40:
        raise ConfigError(f"{path}.node_name_prefix: must be lowercase letters, digits and '-' (<= 40), got {prefix!r}")
    return CloudProviderSettings(
        cert_file=cert,
        key_file=key,
        client_ca_file=client_ca,
        listen=_listen(s, path, "127.0.0.1:8086"),
        backend=read_req_str(s, "backend", path, "kwok", choices=BACKENDS),
        groups=tuple(NodeGroup(g) for g in groups_raw),
        min_size=min_size,
        max_size=max_size,
        node_name_prefix=prefix,
        gpu_label=read_req_str(s, "gpu_label", path, "qos.kube-qos-extender.io/accelerator"),
        node_group_options=read_bool(s, "node_group_options", path, False),
    )


PROVREQ_CLASSES = ("best-effort-atomic-scale-up.autoscaling.x-k8s.io",)


def _parse_provreq(raw: object, path: str) -> ProvisioningRequestSettings | None:
    s = section(
        raw,
        path,
        {"enabled", "namespace", "class_name", "delivered_grace_seconds", "node_reserve", "gated_demand_seconds"},
    )
    if not read_bool(s, "enabled", path, True):
        return None
    namespace = read_req_str(s, "namespace", path, "kube-qos-system")
    if not namespace.replace("-", "").isalnum() or namespace != namespace.lower() or len(namespace) > 63:
        raise ConfigError(
            f"{path}.namespace: must be a namespace name (lowercase letters, digits, '-'), got {namespace!r}"
        )
    # check-capacity never buys (it only simulates against existing nodes): not a way to hand demand over
    class_name = read_req_str(s, "class_name", path, PROVREQ_CLASSES[0], choices=PROVREQ_CLASSES)
    grace = read_number(s, "delivered_grace_seconds", path, 300.0, minimum=1.0, maximum=86_400.0)
    r = section(s.get("node_reserve"), f"{path}.node_reserve", {"cpu", "memory"})
    try:
        reserve = Resources(cpu_millicores(r.get("cpu", "100m")), memory_bytes(r.get("memory", 0)), 0)
    except (InvalidInputError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}.node_reserve: {exc}") from exc
    gated = read_number(s, "gated_demand_seconds", path, 5.0, minimum=0.0, maximum=3600.0)
    return ProvisioningRequestSettings(
        namespace=namespace,
        class_name=class_name,
        delivered_grace_seconds=grace,
        node_reserve=reserve,
        gated_demand_seconds=gated,
    )


def _parse_expander(raw: object, path: str, base: Path | None) -> CaExpanderSettings:
    s = section(raw, path, {"listen", "cert_file", "key_file", "cloud_provider", "provisioning_requests"})
    listen = _listen(s, path, "127.0.0.1:7000")
    cert, key = read_file_path(s, "cert_file", path, base), read_file_path(s, "key_file", path, base)
    if (cert is None) != (key is None):
        raise ConfigError(f"{path}: cert_file and key_file must be set together")
    cloud = None
    if s.get("cloud_provider") is not None:
        cloud = _parse_cloud_provider(s["cloud_provider"], f"{path}.cloud_provider", base)
        if cloud.listen == listen:
            raise ConfigError(f"{path}.cloud_provider.listen: must differ from {path}.listen ({listen})")
    provreq = _parse_provreq(s.get("provisioning_requests"), f"{path}.provisioning_requests")
    return CaExpanderSettings(
        listen=listen, cert_file=cert, key_file=key, cloud_provider=cloud, provisioning_requests=provreq
    )


TOP = {"autoscaler", "flavours"}
SECTION = {
    "scheduler_names",
    "provider",
    "dry_run",
    "scan_interval_seconds",
    "batch_cycle_seconds",
    "burst_debounce_seconds",
    "idle_seconds",
    "provisioning_timeout_seconds",
    "underutil_threshold",
    "underutil_sustain_seconds",
    "batch_queue_quiet_seconds",
    "score_weights",
    "lag",
    "limits",
    "node_name_prefix",
    "scale_down_provisioned_only",
    "metrics",
    "kwok",
    "cluster_autoscaler",
}


def parse_autoscaler_config(raw: object, extender: ExtenderConfig, base: Path | None = None) -> AutoscalerSettings:
    """Validate the autoscaler document; the flavour catalogue comes from it or from the extender file."""
    top = section(raw, "", TOP)
    a = section(top.get("autoscaler"), "autoscaler", SECTION)
    p = "autoscaler"
    flavours = parse_flavours(top["flavours"]) if "flavours" in top else extender.flavours
    try:
        validate_catalogue(flavours)
    except InvalidInputError as exc:
        raise ConfigError(f"flavours: {exc} (set `flavours` here or in the extender config)") from exc
    w = section(a.get("score_weights"), f"{p}.score_weights", {"cpu", "memory"})
    try:
        weights = ScoreWeights(
            read_number(w, "cpu", f"{p}.score_weights", 0.5, minimum=0),
            read_number(w, "memory", f"{p}.score_weights", 0.5, minimum=0),
        )
    except InvalidInputError as exc:
        raise ConfigError(f"{p}.score_weights: {exc}") from exc
    lag = section(a.get("lag"), f"{p}.lag", {"default_seconds", "window", "quantile"})
    quantile = read_number(lag, "quantile", f"{p}.lag", 0.9, minimum=0, maximum=1.0, exclusive_min=True)
    limits = section(
        a.get("limits"),
        f"{p}.limits",
        {"max_nodes_per_cycle", "max_nodes", "max_attempts_per_pod", "retire_drain_seconds"},
    )
    metrics = section(a.get("metrics"), f"{p}.metrics", {"host", "port"})
    kwok = section(a.get("kwok"), f"{p}.kwok", {"lag"})
    cycle = read_number(
        a, "batch_cycle_seconds", p, extender.scheduling.scaling_cycle_seconds, minimum=0, exclusive_min=True
    )
    prefix = read_req_str(a, "node_name_prefix", p, "qos-as")
    if not prefix.replace("-", "").isalnum() or prefix != prefix.lower() or len(prefix) > 40:
        raise ConfigError(f"{p}.node_name_prefix: must be lowercase letters, digits and '-' (<= 40), got {prefix!r}")
    settings = AutoscalerSettings(
        scheduler_names=_names(a, "scheduler_names", p, ("qos-scheduler",)),
        provider=read_req_str(a, "provider", p, "kwok", choices=PROVIDERS),
        dry_run=read_bool(a, "dry_run", p, False),
        scan_interval_seconds=read_number(a, "scan_interval_seconds", p, 30.0, minimum=0, exclusive_min=True),
        batch_cycle_seconds=cycle,
        burst_debounce_seconds=read_number(a, "burst_debounce_seconds", p, 2.0, minimum=0),
        idle_seconds=read_number(a, "idle_seconds", p, 300.0, minimum=0),
        provisioning_timeout_seconds=read_number(
            a, "provisioning_timeout_seconds", p, 900.0, minimum=0, exclusive_min=True
        ),
        underutil_threshold=read_number(a, "underutil_threshold", p, 0.5, minimum=0, maximum=1.0, exclusive_min=True),
        underutil_sustain_seconds=read_number(a, "underutil_sustain_seconds", p, 30.0, minimum=0),
        batch_queue_quiet_seconds=read_number(a, "batch_queue_quiet_seconds", p, 30.0, minimum=0),
        weights=weights,
        lag_default_seconds=read_number(lag, "default_seconds", f"{p}.lag", 120.0, minimum=0),
        lag_window=read_int(lag, "window", f"{p}.lag", 20, minimum=1, maximum=10_000),
        lag_quantile=quantile,
        max_nodes_per_cycle=read_int(limits, "max_nodes_per_cycle", f"{p}.limits", 50, minimum=1, maximum=10_000),
        max_nodes=read_int(limits, "max_nodes", f"{p}.limits", 200, minimum=1, maximum=100_000),
        retire_drain_seconds=read_number(limits, "retire_drain_seconds", f"{p}.limits", 3600.0, minimum=0),
        max_attempts_per_pod=read_int(limits, "max_attempts_per_pod", f"{p}.limits", 3, minimum=1, maximum=1000),
        node_name_prefix=prefix,
        scale_down_provisioned_only=read_bool(a, "scale_down_provisioned_only", p, True),
        metrics_host=read_req_str(metrics, "host", f"{p}.metrics", "127.0.0.1"),
        metrics_port=read_int(metrics, "port", f"{p}.metrics", 8890, minimum=0, maximum=65535),
        flavours=tuple(flavours),
        kwok_lag=_parse_lag(kwok.get("lag"), f"{p}.kwok.lag"),
        expander=_parse_expander(a.get("cluster_autoscaler"), f"{p}.cluster_autoscaler", base),
    )
    if settings.provider == "cluster-autoscaler" and settings.expander.cert_file is None:
        raise ConfigError(
            f"{p}.cluster_autoscaler.cert_file: required with provider cluster-autoscaler "
            "(CA's gRPC expander refuses insecure connections)"
        )
    if settings.expander.cloud_provider is not None and settings.provider != "cluster-autoscaler":
        raise ConfigError(
            f"{p}.cluster_autoscaler.cloud_provider: only with provider cluster-autoscaler "
            f"(got {settings.provider!r}): with the kwok provider the sidecar buys the nodes itself"
        )
    if not math.isfinite(settings.scan_interval_seconds):  # pragma: no cover - read_number checks it
        raise ConfigError(f"{p}.scan_interval_seconds: must be finite")
    return settings


def load_autoscaler_config(path: str | Path | None, extender: ExtenderConfig) -> AutoscalerSettings:
    p = Path(path) if path is not None else DEFAULT_AUTOSCALER_CONFIG
    return load_yaml_config(p, "autoscaler config", lambda raw, base: parse_autoscaler_config(raw, extender, base=base))
