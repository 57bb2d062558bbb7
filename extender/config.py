"""Configuration of `qos-extender serve`: one YAML file, validated completely at start.

Every option is documented in ``config/extender.yaml`` (the default file), which doubles as the reference.
Loading is strict: an unknown key, a wrong type or an out-of-range value stops the process with an error
naming the option (``scheduling.profile: must be one of cost, spread (got 'fast')``), because a typo that
silently falls back to a default changes placement decisions without anyone noticing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

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
from extender.core.qos import RECOMMENDED_HYSTERESIS_SECONDS, RECOMMENDED_QUANTUM_SECONDS, QosPolicy
from extender.settings import SettingsError

T = TypeVar("T")

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "MARKER_RESOURCE",
    "BindConfig",
    "ConfigError",
    "ControllerConfig",
    "ExtenderConfig",
    "KubernetesConfig",
    "NodeGroupsConfig",
    "PodDefaults",
    "SchedulingConfig",
    "ServerConfig",
    "TlsConfig",
    "load_config",
    "load_yaml_config",
    "parse_config",
    "parse_flavours",
    "read_bool",
    "read_file_path",
    "read_int",
    "read_labels",
    "read_number",
    "read_req_str",
    "read_str",
    "section",
]

# Shipped inside the package (package data), so an installed wheel or the image finds its defaults without the
# source tree; config/extender.yaml is a symlink to it, the documented reference users copy and edit.
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "extender.yaml"

PROFILES = ("cost", "spread")
UNLABELLED_POLICIES = ("any", "batch", "service", "none")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MARKER_RESOURCE = "qos.kube-qos-extender.io/managed"


# The client certificates' subject CNs this project's manifests and scripts issue (config/base, hack/).
SCHEDULER_CLIENT_CN = "kube-scheduler-extender-client"
METRICS_CLIENT_CN = "prometheus-extender-client"


class ConfigError(SettingsError):
    """The configuration file is unusable; the message names the offending option."""


# ----------------------------------------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    # Subject common names allowed on the verbs (kube-scheduler's client certificate) and on /metrics (the
    # scraper's): a certificate signed by client_ca_file proves who the client is, these lists say what it may
    # do, so a metrics credential cannot create Bindings.
    verb_clients: tuple[str, ...] = (SCHEDULER_CLIENT_CN,)
    metrics_clients: tuple[str, ...] = (METRICS_CLIENT_CN,)

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8888
    max_body_bytes: int = 64 * 1024 * 1024
    request_timeout_seconds: float = 12.0
    tls: TlsConfig = field(default_factory=TlsConfig)
    # A second, verbs-only listener on 127.0.0.1 without TLS (None: off): for the sidecar topology, where
    # kube-scheduler and the extender share the pod's network namespace and the loopback is private to them.
    loopback_verbs_port: int | None = None


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    kubeconfig: str | None = None
    context: str | None = None
    watch_timeout_seconds: int = 300
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    request_timeout_seconds: float = 30.0
    events: bool = True
    event_component: str = "qos-extender"


@dataclass(frozen=True, slots=True)
class BindConfig:
    timeout_seconds: float = 10.0
    attempt_timeout_seconds: float = 10.0
    backoff_initial_seconds: float = 0.05
    ledger_ttl_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class PodDefaults:
    class_name: str = "bronze"
    class_from_priority: bool = True
    kind: WorkloadKind = WorkloadKind.SERVICE
    batch_runtime_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    profile: str = "cost"
    scaling_cycle_seconds: float = 300.0
    managed_resources: tuple[str, ...] = ()
    # Extended resource that only routes a pod to the extender (kube-scheduler managedResources with
    # ignoredByScheduler): never required from nodes, never counted by filter.
    marker_resource: str | None = MARKER_RESOURCE


@dataclass(frozen=True, slots=True)
class NodeGroupsConfig:
    batch_selector: Mapping[str, str] = field(default_factory=lambda: {"qos.kube-qos-extender.io/node-group": "batch"})
    service_selector: Mapping[str, str] = field(
        default_factory=lambda: {"qos.kube-qos-extender.io/node-group": "service"}
    )
    unlabelled: str = "any"
    enforce: bool = True
    flavour_label: str = "node.kubernetes.io/instance-type"


PERSISTENCE_MODES = ("annotation", "memory")


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    """One controller acts per instance: a coordination.k8s.io Lease (client-go's algorithm). Disabled only
    where a single process is guaranteed (tests, the benchmark's own extender)."""

    enabled: bool = True
    lease_name: str | None = None  # None: kube-qos-extender-<controller.instance>
    lease_namespace: str = "kube-system"
    identity: str | None = None  # None: $POD_NAME, else the host name
    lease_duration_seconds: int = 15  # the Lease API holds whole seconds
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0


HOST_SCORES = ("profile", "least-allocated")


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The QoS controller inside `qos-extender serve` (issue 6): ordering by Q through scheduling gates and
    same-priority QoS preemption through the Eviction API. Durations are in workload seconds: the controller
    multiplies measured wall-clock durations by ``time_compression`` before the policy sees them, and divides
    its own periods (watchdog, gate bound) by it, so a compressed replay takes the same decisions as a real one.
    """

    enabled: bool = False
    watchdog_seconds: float = 10.0
    gate_name: str = "qos.kube-qos-extender.io/ordering"
    scheduler_name: str = "qos-scheduler"
    max_gate_seconds: float = 3600.0
    requeue_pinned_seconds: float = 60.0
    time_compression: float = 1.0
    persistence: str = "annotation"
    persist_interval_seconds: float = 60.0
    persist_min_interval_seconds: float = 2.0
    release_concurrency: int = 48
    pin_node: bool = True
    instance: str = "default"
    host_score: str = "profile"
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)

    @property
    def lease_name(self) -> str:
        return self.leader_election.lease_name or f"kube-qos-extender-{self.instance}"


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    bind: BindConfig = field(default_factory=BindConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    pod_defaults: PodDefaults = field(default_factory=PodDefaults)
    node_groups: NodeGroupsConfig = field(default_factory=NodeGroupsConfig)
    policy: QosPolicy = field(
        default_factory=lambda: QosPolicy(
            min_run_quantum_seconds=RECOMMENDED_QUANTUM_SECONDS, q_hysteresis_seconds=RECOMMENDED_HYSTERESIS_SECONDS
        )
    )
    flavours: tuple[Flavour, ...] = ()
    log_level: str = "INFO"
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    # The `slack` section as given (None: absent): validated by extender.controller.slack_config, which sits
    # above config in the import layers because its types are the slack controller's (issue 16).
    slack: Any = None


# ---------------------------------------------------------------------------------------------- checkers
# Public and shared: the autoscaler and consolidation configs are parsed with these same strict readers, so
# every file rejects unknown keys, wrong types and out-of-range values the same way, naming the option path.


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def section(raw: object, path: str, allowed: set[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, f"must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if not isinstance(key, str):
            raise _fail(path, f"keys must be strings, got {key!r}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise _fail(
            f"{path}.{unknown[0]}" if path else unknown[0], f"unknown option (known: {', '.join(sorted(allowed))})"
        )
    return dict(raw)


def read_bool(raw: dict[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise _fail(f"{path}.{key}", f"must be true or false, got {value!r}")
    return value


def read_number(
    raw: dict[str, Any],
    key: str,
    path: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_min: bool = False,
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(f"{path}.{key}", f"must be a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if exclusive_min else value < minimum):
        raise _fail(f"{path}.{key}", f"must be {'>' if exclusive_min else '>='} {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise _fail(f"{path}.{key}", f"must be <= {maximum}, got {value!r}")
    return float(value)


def read_int(raw: dict[str, Any], key: str, path: str, default: int, *, minimum: int, maximum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{path}.{key}", f"must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise _fail(f"{path}.{key}", f"must be between {minimum} and {maximum}, got {value}")
    return value


def read_str(
    raw: dict[str, Any], key: str, path: str, default: str | None, *, choices: tuple[str, ...] = ()
) -> str | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(f"{path}.{key}", f"must be a non-empty string, got {value!r}")
    if choices and value not in choices:
        raise _fail(f"{path}.{key}", f"must be one of {', '.join(choices)} (got {value!r})")
    return value


def read_req_str(raw: dict[str, Any], key: str, path: str, default: str, *, choices: tuple[str, ...] = ()) -> str:
    value = read_str(raw, key, path, default, choices=choices)
    if value is None:
        raise _fail(f"{path}.{key}", "must not be null")
    return value


def read_file_path(raw: dict[str, Any], key: str, path: str, base: Path | None) -> str | None:
    value = read_str(raw, key, path, None)
    if value is None:
        return None
    p = Path(value)
    if not p.is_absolute() and base is not None:
        p = base / p
    if not p.is_file():
        raise _fail(f"{path}.{key}", f"file {str(p)!r} does not exist")
    return str(p)


def read_labels(raw: dict[str, Any], key: str, path: str, default: Mapping[str, str]) -> dict[str, str]:
    value = raw.get(key, dict(default))
    if not isinstance(value, dict):
        raise _fail(f"{path}.{key}", f"must be a mapping of label -> value, got {type(value).__name__}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise _fail(f"{path}.{key}", f"labels must be non-empty strings mapped to strings, got {k!r}: {v!r}")
        out[k] = v
    return out


# ----------------------------------------------------------------------------------------------- parsing


def _parse_server(raw: object, base: Path | None) -> ServerConfig:
    path = "server"
    s = section(raw, path, {"host", "port", "max_body_bytes", "request_timeout_seconds", "tls", "loopback_verbs_port"})
    t = section(
        s.get("tls"), f"{path}.tls", {"cert_file", "key_file", "client_ca_file", "verb_clients", "metrics_clients"}
    )
    tls = TlsConfig(
        cert_file=read_file_path(t, "cert_file", f"{path}.tls", base),
        key_file=read_file_path(t, "key_file", f"{path}.tls", base),
        client_ca_file=read_file_path(t, "client_ca_file", f"{path}.tls", base),
        verb_clients=_read_names(t, "verb_clients", f"{path}.tls", (SCHEDULER_CLIENT_CN,)),
        metrics_clients=_read_names(t, "metrics_clients", f"{path}.tls", (METRICS_CLIENT_CN,)),
    )
    loopback = s.get("loopback_verbs_port")
    if loopback is not None:
        loopback = read_int(s, "loopback_verbs_port", path, 0, minimum=1, maximum=65535)
    if (tls.cert_file is None) != (tls.key_file is None):
        raise _fail(f"{path}.tls", "cert_file and key_file must be set together")
    if tls.client_ca_file is not None and tls.cert_file is None:
        raise _fail(f"{path}.tls.client_ca_file", "client certificates need TLS: set cert_file and key_file too")
    return ServerConfig(
        host=read_req_str(s, "host", path, "127.0.0.1"),
        port=read_int(s, "port", path, 8888, minimum=0, maximum=65535),
        max_body_bytes=read_int(s, "max_body_bytes", path, 64 * 1024 * 1024, minimum=1024, maximum=2**31),
        request_timeout_seconds=read_number(s, "request_timeout_seconds", path, 12.0, minimum=0, exclusive_min=True),
        tls=tls,
        loopback_verbs_port=loopback,
    )


def _read_names(raw: dict[str, Any], key: str, path: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A list of certificate subject common names; empty means nobody (a path nobody may call)."""
    value = raw.get(key, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(f"{path}.{key}", f"must be a list of non-empty strings (certificate subject CNs), got {value!r}")
    return tuple(value)


def _parse_kubernetes(raw: object, base: Path | None) -> KubernetesConfig:
    path = "kubernetes"
    k = section(
        raw,
        path,
        {
            "kubeconfig",
            "context",
            "watch_timeout_seconds",
            "backoff_initial_seconds",
            "backoff_max_seconds",
            "request_timeout_seconds",
            "events",
            "event_component",
        },
    )
    initial = read_number(k, "backoff_initial_seconds", path, 0.5, minimum=0, exclusive_min=True)
    maximum = read_number(k, "backoff_max_seconds", path, 30.0, minimum=0, exclusive_min=True)
    if maximum < initial:
        raise _fail(f"{path}.backoff_max_seconds", f"must be >= backoff_initial_seconds ({initial})")
    return KubernetesConfig(
        kubeconfig=read_file_path(k, "kubeconfig", path, base),
        context=read_str(k, "context", path, None),
        watch_timeout_seconds=read_int(k, "watch_timeout_seconds", path, 300, minimum=1, maximum=3600),
        backoff_initial_seconds=initial,
        backoff_max_seconds=maximum,
        request_timeout_seconds=read_number(k, "request_timeout_seconds", path, 30.0, minimum=0, exclusive_min=True),
        events=read_bool(k, "events", path, True),
        event_component=read_req_str(k, "event_component", path, "qos-extender"),
    )


def _parse_bind(raw: object, server: ServerConfig) -> BindConfig:
    path = "bind"
    b = section(
        raw, path, {"timeout_seconds", "attempt_timeout_seconds", "backoff_initial_seconds", "ledger_ttl_seconds"}
    )
    total = read_number(b, "timeout_seconds", path, 10.0, minimum=0, exclusive_min=True)
    # Unset: one attempt may use the whole budget. A slow Binding POST is being applied by a loaded API server;
    # cutting it and sending it again doubles that load and mostly ends in a 409 (issue 17).
    if b.get("attempt_timeout_seconds") is None:
        b = {k: v for k, v in b.items() if k != "attempt_timeout_seconds"}  # null: the whole budget
    attempt = read_number(b, "attempt_timeout_seconds", path, total, minimum=0, exclusive_min=True)
    if attempt > total:
        raise _fail(f"{path}.attempt_timeout_seconds", f"must be <= bind.timeout_seconds ({total})")
    if total >= server.request_timeout_seconds:
        raise _fail(
            f"{path}.timeout_seconds",
            f"must be < server.request_timeout_seconds ({server.request_timeout_seconds}): a bind must answer "
            "before the request is cut off",
        )
    return BindConfig(
        timeout_seconds=total,
        attempt_timeout_seconds=attempt,
        backoff_initial_seconds=read_number(b, "backoff_initial_seconds", path, 0.05, minimum=0, exclusive_min=True),
        ledger_ttl_seconds=read_number(b, "ledger_ttl_seconds", path, 30.0, minimum=0, exclusive_min=True),
    )


def _parse_scheduling(raw: object) -> SchedulingConfig:
    path = "scheduling"
    s = section(raw, path, {"profile", "scaling_cycle_seconds", "managed_resources", "marker_resource"})
    managed = s.get("managed_resources", [])
    if not isinstance(managed, list) or not all(isinstance(m, str) and m for m in managed):
        raise _fail(f"{path}.managed_resources", f"must be a list of resource names, got {managed!r}")
    for name in managed:
        if name in ("cpu", "memory", "pods"):
            raise _fail(f"{path}.managed_resources", f"{name!r} is always checked; list only extended resources")
        if "/" not in name:
            raise _fail(f"{path}.managed_resources", f"{name!r} is not an extended resource name (domain/name)")
    if len(set(managed)) != len(managed):
        raise _fail(f"{path}.managed_resources", "duplicate resource names")
    marker = read_str(s, "marker_resource", path, MARKER_RESOURCE)
    if marker is not None and "/" not in marker:
        raise _fail(f"{path}.marker_resource", f"{marker!r} is not an extended resource name (domain/name)")
    if marker is not None and marker in managed:
        raise _fail(
            f"{path}.managed_resources",
            f"{marker!r} is the marker_resource: nodes never advertise it, so filter must not check it",
        )
    return SchedulingConfig(
        profile=read_req_str(s, "profile", path, "cost", choices=PROFILES),
        scaling_cycle_seconds=read_number(s, "scaling_cycle_seconds", path, 300.0, minimum=0, exclusive_min=True),
        managed_resources=tuple(managed),
        marker_resource=marker,
    )


def _parse_pod_defaults(raw: object, classes: Mapping[str, ServiceClass]) -> PodDefaults:
    path = "pod_defaults"
    d = section(raw, path, {"class", "class_from_priority", "kind", "batch_runtime_seconds"})
    class_name = read_req_str(d, "class", path, "bronze")
    if class_name not in classes:
        raise _fail(f"{path}.class", f"unknown class {class_name!r} (defined: {', '.join(sorted(classes))})")
    kind = read_req_str(d, "kind", path, "service", choices=("batch", "service"))
    runtime: float | None = None
    if d.get("batch_runtime_seconds") is not None:
        runtime = read_number(d, "batch_runtime_seconds", path, 0.0, minimum=0)
    return PodDefaults(
        class_name=class_name,
        class_from_priority=read_bool(d, "class_from_priority", path, True),
        kind=WorkloadKind(kind),
        batch_runtime_seconds=runtime,
    )


def _parse_node_groups(raw: object) -> NodeGroupsConfig:
    path = "node_groups"
    g = section(raw, path, {"batch", "service", "unlabelled", "enforce", "flavour_label"})
    selectors: dict[str, dict[str, str]] = {}
    defaults = NodeGroupsConfig()
    for group, default in (("batch", defaults.batch_selector), ("service", defaults.service_selector)):
        group_raw = section(g.get(group, {}), f"{path}.{group}", {"match_labels"})
        selectors[group] = read_labels(group_raw, "match_labels", f"{path}.{group}", default)
        if not selectors[group]:
            raise _fail(f"{path}.{group}.match_labels", "must not be empty (an empty selector matches every node)")
    if selectors["batch"] == selectors["service"]:
        raise _fail(f"{path}", "batch and service selectors are identical: no node could be told apart")
    return NodeGroupsConfig(
        batch_selector=selectors["batch"],
        service_selector=selectors["service"],
        unlabelled=read_req_str(g, "unlabelled", path, "any", choices=UNLABELLED_POLICIES),
        enforce=read_bool(g, "enforce", path, True),
        flavour_label=read_req_str(g, "flavour_label", path, "node.kubernetes.io/instance-type"),
    )


def _parse_classes(raw: object) -> dict[str, ServiceClass]:
    path = "classes"
    if raw is None:
        return dict(DEFAULT_CLASSES)
    if not isinstance(raw, dict) or not raw:
        raise _fail(path, "must be a non-empty mapping of class name -> {slo, importance, ...}")
    out: dict[str, ServiceClass] = {}
    for name, body in raw.items():
        if not isinstance(name, str) or not name:
            raise _fail(path, f"class names must be non-empty strings, got {name!r}")
        cpath = f"{path}.{name}"
        c = section(body, cpath, {"slo", "importance", "safety_margin_seconds", "priority"})
        for required in ("slo", "importance"):
            if required not in c:
                raise _fail(f"{cpath}.{required}", "is required")
        slo = read_number(c, "slo", cpath, 1.0, minimum=0, maximum=1.0, exclusive_min=True)
        importance = read_int(c, "importance", cpath, 1, minimum=1, maximum=1000)
        margin = read_number(c, "safety_margin_seconds", cpath, 10.0)
        priority = read_int(c, "priority", cpath, 0, minimum=-(2**31), maximum=10**9)
        try:
            out[name] = ServiceClass(name, slo, importance, margin, priority)
        except InvalidInputError as exc:  # pragma: no cover - the checks above are stricter
            raise _fail(cpath, str(exc)) from exc
    return out


def _parse_policy(raw: object, classes: Mapping[str, ServiceClass]) -> QosPolicy:
    path = "qos"
    q = section(
        raw,
        path,
        {"alpha_seconds", "min_run_quantum_seconds", "q_hysteresis_seconds", "overhead_cap", "relax_by_importance"},
    )
    return QosPolicy(
        classes=classes,
        alpha_seconds=read_number(q, "alpha_seconds", path, 2.0, minimum=0),
        min_run_quantum_seconds=read_number(q, "min_run_quantum_seconds", path, RECOMMENDED_QUANTUM_SECONDS, minimum=0),
        q_hysteresis_seconds=read_number(q, "q_hysteresis_seconds", path, RECOMMENDED_HYSTERESIS_SECONDS, minimum=0),
        overhead_cap=read_bool(q, "overhead_cap", path, True),
        relax_by_importance=read_bool(q, "relax_by_importance", path, True),
    )


def parse_flavours(raw: object) -> tuple[Flavour, ...]:
    path = "flavours"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _fail(path, f"must be a list, got {type(raw).__name__}")
    out: list[Flavour] = []
    seen: set[str] = set()
    for i, body in enumerate(raw):
        fpath = f"{path}[{i}]"
        f = section(body, fpath, {"name", "cpu", "memory", "pods", "price_per_hour"})
        for required in ("name", "cpu", "memory", "price_per_hour"):
            if required not in f:
                raise _fail(f"{fpath}.{required}", "is required")
        name = read_req_str(f, "name", fpath, "")
        if name in seen:
            raise _fail(f"{fpath}.name", f"duplicate flavour {name!r}")
        seen.add(name)
        try:
            cpu = cpu_millicores(f["cpu"])
        except InvalidInputError as exc:
            raise _fail(f"{fpath}.cpu", str(exc)) from exc
        try:
            mem = memory_bytes(f["memory"])
        except InvalidInputError as exc:
            raise _fail(f"{fpath}.memory", str(exc)) from exc
        pods = read_int(f, "pods", fpath, 110, minimum=1, maximum=100000)
        price = read_number(f, "price_per_hour", fpath, 0.0, minimum=0, exclusive_min=True)
        try:
            out.append(Flavour(name, Resources(cpu, mem, pods), price))
        except InvalidInputError as exc:
            raise _fail(fpath, str(exc)) from exc
    return tuple(out)


def _parse_controller(raw: object) -> ControllerConfig:
    path = "controller"
    c = section(
        raw,
        path,
        {
            "enabled",
            "watchdog_seconds",
            "gate_name",
            "scheduler_name",
            "max_gate_seconds",
            "requeue_pinned_seconds",
            "time_compression",
            "persistence",
            "persist_interval_seconds",
            "persist_min_interval_seconds",
            "release_concurrency",
            "pin_node",
            "instance",
            "host_score",
            "leader_election",
        },
    )
    gate = read_req_str(c, "gate_name", path, "qos.kube-qos-extender.io/ordering")
    if "/" not in gate:
        raise _fail(f"{path}.gate_name", f"{gate!r} must be a qualified name (domain/name) owned by this controller")
    watchdog = read_number(c, "watchdog_seconds", path, 10.0, minimum=0, exclusive_min=True)
    max_gate = read_number(c, "max_gate_seconds", path, 3600.0, minimum=0, exclusive_min=True)
    if max_gate < watchdog:
        raise _fail(f"{path}.max_gate_seconds", f"must be >= watchdog_seconds ({watchdog})")
    return ControllerConfig(
        enabled=read_bool(c, "enabled", path, False),
        watchdog_seconds=watchdog,
        gate_name=gate,
        scheduler_name=read_req_str(c, "scheduler_name", path, "qos-scheduler"),
        max_gate_seconds=max_gate,
        requeue_pinned_seconds=read_number(c, "requeue_pinned_seconds", path, 60.0, minimum=0, exclusive_min=True),
        time_compression=read_number(c, "time_compression", path, 1.0, minimum=0, exclusive_min=True, maximum=1000.0),
        persistence=read_req_str(c, "persistence", path, "annotation", choices=PERSISTENCE_MODES),
        persist_interval_seconds=read_number(c, "persist_interval_seconds", path, 60.0, minimum=0, exclusive_min=True),
        persist_min_interval_seconds=read_number(c, "persist_min_interval_seconds", path, 2.0, minimum=0),
        release_concurrency=read_int(c, "release_concurrency", path, 48, minimum=1, maximum=1024),
        pin_node=read_bool(c, "pin_node", path, True),
        instance=_instance_name(c, path),
        host_score=read_req_str(c, "host_score", path, "profile", choices=HOST_SCORES),
        leader_election=_parse_leader_election(c.get("leader_election"), f"{path}.leader_election"),
    )


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


def _instance_name(c: dict[str, Any], path: str) -> str:
    """A DNS label: it becomes a Lease name suffix, an annotation and a namespace label value."""
    name = read_req_str(c, "instance", path, "default")
    if not _DNS_LABEL.match(name):
        raise _fail(f"{path}.instance", f"{name!r} must be a lowercase DNS label of at most 40 characters")
    return name


def _parse_leader_election(raw: object, path: str) -> LeaderElectionConfig:
    le = section(
        raw,
        path,
        {
            "enabled",
            "lease_name",
            "lease_namespace",
            "identity",
            "lease_duration_seconds",
            "renew_deadline_seconds",
            "retry_period_seconds",
        },
    )
    duration = read_int(le, "lease_duration_seconds", path, 15, minimum=2, maximum=3600)
    renew = read_number(le, "renew_deadline_seconds", path, 10.0, minimum=1)
    retry = read_number(le, "retry_period_seconds", path, 2.0, minimum=1)
    # client-go's (and kubernetes-asyncio's) invariants: a renewal must fit in the deadline with jitter,
    # and the deadline must end before another candidate may take the lease.
    if duration <= renew:
        raise _fail(f"{path}.renew_deadline_seconds", f"must be < lease_duration_seconds ({duration})")
    if renew <= 1.2 * retry:
        raise _fail(f"{path}.retry_period_seconds", f"must be < renew_deadline_seconds / 1.2 ({renew / 1.2:.2f})")
    return LeaderElectionConfig(
        enabled=read_bool(le, "enabled", path, True),
        lease_name=read_str(le, "lease_name", path, None),
        lease_namespace=read_req_str(le, "lease_namespace", path, "kube-system"),
        identity=read_str(le, "identity", path, None),
        lease_duration_seconds=duration,
        renew_deadline_seconds=renew,
        retry_period_seconds=retry,
    )


TOP_LEVEL = {
    "server",
    "kubernetes",
    "bind",
    "scheduling",
    "pod_defaults",
    "node_groups",
    "qos",
    "classes",
    "flavours",
    "logging",
    "controller",
    "slack",
}


def parse_config(raw: object, base: Path | None = None) -> ExtenderConfig:
    """Validate a parsed YAML document; ``base`` resolves relative file paths (the config file's folder)."""
    top = section(raw, "", TOP_LEVEL)
    classes = _parse_classes(top.get("classes"))
    server = _parse_server(top.get("server"), base)
    logging_section = section(top.get("logging"), "logging", {"level"})
    try:
        policy = _parse_policy(top.get("qos"), classes)
    except InvalidInputError as exc:  # pragma: no cover - the checks above are stricter
        raise _fail("qos", str(exc)) from exc
    return ExtenderConfig(
        server=server,
        kubernetes=_parse_kubernetes(top.get("kubernetes"), base),
        bind=_parse_bind(top.get("bind"), server),
        scheduling=_parse_scheduling(top.get("scheduling")),
        pod_defaults=_parse_pod_defaults(top.get("pod_defaults"), classes),
        node_groups=_parse_node_groups(top.get("node_groups")),
        policy=policy,
        flavours=parse_flavours(top.get("flavours")),
        log_level=read_req_str(logging_section, "level", "logging", "INFO", choices=LOG_LEVELS),
        controller=_parse_controller(top.get("controller")),
        slack=top.get("slack"),
    )


def load_yaml_config(path: Path, what: str, parse: Callable[[Any, Path], T]) -> T:
    """Read, YAML-parse and validate one config file with ``parse(raw, base_dir)`` (an empty file is ``{}``).
    Shared by the extender, autoscaler and consolidation configs so every error names the file the same way:
    unreadable, not YAML, or the option path the parser rejected."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return parse(raw if raw is not None else {}, path.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def load_config(path: str | Path | None = None) -> ExtenderConfig:
    """Read and validate the YAML file at ``path`` (default ``config/extender.yaml``)."""
    p = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    return load_yaml_config(p, "config file", lambda raw, base: parse_config(raw, base=base))
