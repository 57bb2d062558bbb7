"""config/ as shipped, without a cluster or kubectl: the configuration files the workloads mount parse with the
project's own loaders (so an invalid shipped config fails here) and agree with the manifests that mount them,
the copies of reference configs did not drift, and every ClusterRole grants exactly what the code calls (in
config/cluster-autoscaler, cluster-autoscaler's own roles are classified as CA's and bound to CA only, not matched).

The rendered objects (kustomize), the API server's server-side dry run, Pod Security admission and real
authorization checks (SubjectAccessReview) are in e2e/test_manifests.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.agent.settings import AgentConfigError, load_agent_config
from extender.autoscaler.settings import parse_autoscaler_config
from extender.consolidation.settings import parse_consolidation_config
from extender.core.owners import HANDED_OVER_RESOURCES
from extender.settings import SettingsError
from extender.settings.extender import deep_merge, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"

Rule = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(path: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in _docs(path) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def _mounts(workload: dict[str, Any], container: str) -> dict[str, dict[str, Any]]:
    """volume name -> {mountPath, volume}"""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    return {m["name"]: {**m, "volume": volumes[m["name"]]} for m in _container(workload, container)["volumeMounts"]}


def _mounted_from(workload: dict[str, Any], container: str, path: str) -> dict[str, Any]:
    """The volume mount that holds ``path`` (longest mountPath prefix)."""
    hits = [m for m in _mounts(workload, container).values() if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert hits, f"{path} is on no volume of {workload['metadata']['name']}/{container}"
    return max(hits, key=lambda m: len(m["mountPath"]))


def _with_stand_ins(doc: Any, keys: tuple[str, ...]) -> Any:
    """Replace the values of file options (paths inside the pod) by a file that exists here."""
    stand_in = str(CONFIG / "base" / "kustomization.yaml")
    if isinstance(doc, dict):
        return {k: stand_in if k in keys and v else _with_stand_ins(v, keys) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_with_stand_ins(v, keys) for v in doc]
    return doc


def _generated_files(kustomization: Path, name: str) -> list[str]:
    (gen,) = [g for g in _load(kustomization)["configMapGenerator"] if g["name"] == name]
    return [f.split("=")[-1] for f in gen["files"]]


# ------------------------------------------------------------------------------------------------ node agent

AGENT = CONFIG / "agent"


@pytest.fixture(scope="module")
def agent_ds() -> dict[str, Any]:
    return _one(AGENT / "daemonset.yaml", "DaemonSet")


def test_agent_config_loads_and_matches_the_daemonset(agent_ds: dict[str, Any]) -> None:
    cfg = load_agent_config(str(AGENT / "agent.yaml"), node_name="node-a")
    assert cfg.backend == "kubelet" and not cfg.test_fault_injection and not cfg.allow_plaintext
    assert cfg.tls.enabled and cfg.tls.key_file and cfg.tls.ca_file
    c = _container(agent_ds, "agent")
    assert "--config=/etc/qos-agent/config/agent.yaml" in c["args"] and "--node-name=$(NODE_NAME)" in c["args"]
    config_mount = _mounted_from(agent_ds, "agent", "/etc/qos-agent/config/agent.yaml")
    assert config_mount["volume"]["configMap"]["name"] == "qos-agent-config"
    assert _generated_files(AGENT / "kustomization.yaml", "qos-agent-config") == ["agent.yaml"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "NODE_IP": "status.hostIP"}  # NODE_IP: make_backend's kubelet
    (port,) = c["ports"]
    assert port["containerPort"] == port["hostPort"] == cfg.port == 9443 and cfg.host == "0.0.0.0"
    # Every file the config names is on the volume that should hold it: this node's certificates and keys on a
    # memory-backed emptyDir the agent writes (identity.enabled), the CAs from a ConfigMap (public).
    assert cfg.identity.enabled
    for path in (cfg.tls.cert_file, cfg.tls.key_file, cfg.kubelet.cert_file, cfg.kubelet.key_file):
        assert path is not None
        assert _mounted_from(agent_ds, "agent", path)["volume"]["emptyDir"]["medium"] == "Memory", path
    for path in (cfg.tls.ca_file, cfg.kubelet.ca_file):
        assert path is not None
        assert _mounted_from(agent_ds, "agent", path)["volume"]["configMap"]["name"] == "qos-agent-ca", path
    mounts = _mounts(agent_ds, "agent")
    assert mounts["state"]["mountPath"] == cfg.state_dir and "hostPath" in mounts["state"]["volume"]
    checkpoints = mounts["kubelet-checkpoints"]
    assert checkpoints["mountPath"] == cfg.kubelet.checkpoint_dir == "/var/lib/kubelet/checkpoints"
    assert checkpoints["volume"]["hostPath"]["path"] == "/var/lib/kubelet/checkpoints"
    # The readiness probe presents the agent's own certificate (every route requires one).
    probe = " ".join(c["readinessProbe"]["exec"]["command"])
    for path in (cfg.tls.cert_file, cfg.tls.key_file, cfg.tls.ca_file, f"127.0.0.1:{cfg.port}/healthz"):
        assert path in probe


def test_the_agent_config_check_is_not_vacuous(tmp_path: Path) -> None:
    doc = _load(AGENT / "agent.yaml")
    for broken in ({"backend": "kubelt"}, {"tls": None}, {"kubelet": {"portt": 1}}, {"retry": {"attempts": 0}}):
        bad = tmp_path / "agent.yaml"
        bad.write_text(yaml.safe_dump({"agent": {**doc["agent"], **broken}}))
        with pytest.raises(AgentConfigError):
            load_agent_config(str(bad), node_name="n")


def test_agent_pod_privileges_are_the_documented_minimum(agent_ds: dict[str, Any]) -> None:
    spec = agent_ds["spec"]["template"]["spec"]
    assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC")
    # the token is the pod's proof of its node for the CSRs (extender/agent/identity.py)
    assert spec["automountServiceAccountToken"] is True
    assert spec["tolerations"] == [{"operator": "Exists"}]
    # never on a control-plane node, nor where migration is disabled (issue #29)
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"} in term["matchExpressions"]
    sc = _container(agent_ds, "agent")["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # the runtime's socket directory: a migration's destination imports the checkpoint image into the node's
    # containerd (issue 13; config/agent/daemonset.yaml says why and how to drop it), read-only (the socket is
    # still connectable, and a directory mount survives a containerd restart); nothing else of the host
    assert host_paths == {
        "/var/lib/kubelet/checkpoints",
        "/var/lib/kube-qos-extender/agent",
        "/run/containerd",
    }
    mounts = {m["name"]: m for m in _container(agent_ds, "agent")["volumeMounts"]}
    assert mounts["containerd"] == {"name": "containerd", "mountPath": "/run/containerd", "readOnly": True}
    ns = _one(AGENT / "namespace.yaml", "Namespace")
    assert ns["metadata"]["name"] == agent_ds["metadata"]["namespace"] == "kube-qos-agent"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for sa in _docs(AGENT / "serviceaccount.yaml"):  # the pods opt in; nothing else of the namespace gets a token
        assert sa["automountServiceAccountToken"] is False


def test_crio_component_points_the_agent_at_crio_and_its_store(agent_ds: dict[str, Any]) -> None:
    """config/agent/crio: the flag, CRI-O's socket directory where kubelet.crio_socket looks, its store at CRI-O's
    default paths (the agent reads them from CRI-O's /config: same paths inside and out), containerd's gone."""
    import argparse

    from extender.processes.agent import add_agent_arguments

    comp = _load(AGENT / "crio" / "kustomization.yaml")
    assert comp["kind"] == "Component"
    (ref,) = [p for p in comp["patches"] if p["target"]["kind"] == "DaemonSet"]
    patch = _load(AGENT / "crio" / ref["path"])
    spec = patch["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    base = _container(agent_ds, "agent")
    assert c["args"] == [*base["args"], "--container-runtime=cri-o"]
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    args = parser.parse_args(c["args"][1:])
    cfg = load_agent_config(str(AGENT / "agent.yaml"), node_name="n", kubelet={"runtime": args.container_runtime})
    assert cfg.kubelet.runtime == "cri-o" and cfg.kubelet.crio_socket == "/var/run/crio/crio.sock"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/run/containerd"] == {"mountPath": "/run/containerd", "$patch": "delete"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["containerd"] == {"name": "containerd", "$patch": "delete"}
    socket_dir = mounts[str(Path(cfg.kubelet.crio_socket).parent)]
    assert socket_dir["readOnly"] is True and volumes[socket_dir["name"]]["hostPath"]["path"] == "/var/run/crio"
    for path in ("/var/lib/containers/storage", "/run/containers/storage"):  # CRI-O's defaults, same in and out
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path and not mounts[path].get("readOnly")
    # what CRI-O gives a mount holding its storage root anyway, said in the spec
    assert mounts["/var/lib/containers/storage"]["mountPropagation"] == "HostToContainer"
    # skopeo re-executes itself in a user namespace unless it holds CHOWN, DAC_OVERRIDE, FOWNER, FSETID, MKNOD and
    # SETFCAP (which fails in a pod), and containers/storage's overlay driver remounts its home private
    # (SYS_ADMIN); both seen on the lab's CRI-O nodes. Nothing else is added.
    assert c["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "MKNOD", "SETFCAP", "SYS_ADMIN"],
    }
    # the lab's overlay uses it on top of config/local
    local = _load(CONFIG / "local-crio" / "kustomization.yaml")
    assert local["resources"] == ["../local"] and local["components"] == ["../agent/crio"]


def test_agent_network_policy_admits_only_agents_the_autoscaler_and_prometheus(agent_ds: dict[str, Any]) -> None:
    pol = _one(AGENT / "networkpolicy.yaml", "NetworkPolicy")
    labels = agent_ds["spec"]["template"]["metadata"]["labels"]
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9443, "protocol": "TCP"}]
    autoscaler = _one(CONFIG / "autoscaler" / "deployment.yaml", "Deployment")
    peers = [f["podSelector"]["matchLabels"] for f in rule["from"]]
    assert pol["spec"]["podSelector"]["matchLabels"] in peers
    assert autoscaler["spec"]["template"]["metadata"]["labels"].items() >= peers[1].items()
    assert rule["from"][1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": autoscaler["metadata"]["namespace"]
    }


# ------------------------------------------------------------------------------------------------ autoscaler

AUTOSCALER = CONFIG / "autoscaler"


@pytest.fixture(scope="module")
def autoscaler_dep() -> dict[str, Any]:
    return _one(AUTOSCALER / "deployment.yaml", "Deployment")


def test_autoscaler_configs_load_and_match_the_deployment(autoscaler_dep: dict[str, Any]) -> None:
    c = _container(autoscaler_dep, "autoscaler")
    args = dict(a.split("=", 1) for a in c["args"][1:])
    assert c["args"][0] == "autoscaler" and set(args) == {"--config", "--autoscaler-config"}
    files = _generated_files(AUTOSCALER / "kustomization.yaml", "qos-autoscaler-config")
    for path in args.values():
        mount = _mounted_from(autoscaler_dep, "autoscaler", path)
        assert mount["volume"]["configMap"]["name"] == "qos-autoscaler-config"
        assert path.rsplit("/", 1)[1] in files
    extender = load_config(AUTOSCALER / "extender.yaml")
    assert extender.kubernetes.kubeconfig is None  # in-cluster service account
    raw = _load(AUTOSCALER / "autoscaler.yaml")
    settings = parse_autoscaler_config(_with_stand_ins(raw, ("cert_file", "key_file", "client_ca_file")), extender)
    # production: beside the user's cluster-autoscaler, gated demand handed to it, never a node written
    assert settings.provider == "cluster-autoscaler" and not settings.dry_run
    assert settings.expander.provisioning_requests is not None
    assert settings.expander.provisioning_requests.namespace == autoscaler_dep["metadata"]["namespace"]
    assert settings.metrics_host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": settings.metrics_port, "grpc-expander": 7000}
    assert settings.expander.listen == f"0.0.0.0:{ports['grpc-expander']}"
    for key in ("cert_file", "key_file"):
        mount = _mounted_from(autoscaler_dep, "autoscaler", raw["autoscaler"]["cluster_autoscaler"][key])
        assert mount["volume"]["secret"]["secretName"] == "qos-autoscaler-expander-tls"
    # /metrics over HTTPS (issue 29): its certificate and the scraper's CA from their own Secret; probes in HTTPS
    assert settings.metrics.cert_file is not None and settings.metrics.clients
    for key in ("cert_file", "key_file", "client_ca_file"):
        mount = _mounted_from(autoscaler_dep, "autoscaler", raw["autoscaler"]["metrics"][key])
        assert mount["volume"]["secret"]["secretName"] == "qos-autoscaler-metrics-tls"
    assert c["readinessProbe"]["httpGet"]["scheme"] == c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    monitor = _one(AUTOSCALER / "servicemonitor.yaml", "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["cert"]["secret"]["name"] == (
        "qos-extender-metrics-client"
    )
    svc = _one(AUTOSCALER / "expander-service.yaml", "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "grpc-expander" and svc["spec"]["ports"][0]["port"] == 7000
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Leader election (the Lease, extender/controller/leader.py): two replicas, one acts; a rolling update never
    # leaves none (the old pod releases its Lease as it stops). POD_NAME is the identity.
    assert autoscaler_dep["spec"]["replicas"] == 2 and autoscaler_dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]


def test_the_autoscaler_and_the_extender_agree_on_what_they_share() -> None:
    """Both read node groups, pod defaults, classes, QoS knobs and flavours from their own file (overlays of the
    same defaults): a sidecar planning with other classes or flavours than the extender places by would buy
    nodes no pod lands on."""
    raw = deep_merge(_load(CONFIG / "base" / "extender.yaml"), _load(CONFIG / "controller" / "controller.yaml"))
    extender = parse_config(_with_stand_ins(raw, ("cert_file", "key_file", "client_ca_file")))
    autoscaler = load_config(AUTOSCALER / "extender.yaml")
    for section in ("kubernetes", "bind", "pod_defaults", "node_groups", "qos", "classes", "flavours"):
        assert getattr(autoscaler, section) == getattr(extender, section), section
    assert autoscaler.scheduling.scaling_cycle_seconds == extender.scheduling.scaling_cycle_seconds
    # the autoscaler files hold only what differs from the defaults (tests/test_settings.py); what they set:
    lab = _load(KWOK / "autoscaler.yaml")["autoscaler"]  # the kwok Component: the defaults but metrics.host
    metrics_tls = {
        "host": "0.0.0.0",
        "cert_file": "/etc/qos-autoscaler/metrics-tls/tls.crt",
        "key_file": "/etc/qos-autoscaler/metrics-tls/tls.key",
        "client_ca_file": "/etc/qos-autoscaler/metrics-tls/ca.crt",
    }
    assert lab == {"metrics": metrics_tls}
    ours = _load(AUTOSCALER / "autoscaler.yaml")["autoscaler"]  # production: CA, the expander served to CA's pod
    assert ours.pop("provider") == "cluster-autoscaler" and ours.pop("metrics") == metrics_tls
    ca = ours.pop("cluster_autoscaler")
    assert ca.pop("listen") == "0.0.0.0:7000" and set(ca.pop("cert_file") + ca.pop("key_file"))
    assert ca == {} and ours == {}


def test_the_autoscaler_config_check_is_not_vacuous() -> None:
    extender = load_config(AUTOSCALER / "extender.yaml")
    doc = _with_stand_ins(_load(AUTOSCALER / "autoscaler.yaml"), ("cert_file", "key_file", "client_ca_file"))
    parse_autoscaler_config(doc, extender)
    for broken in (
        {"provider": "aws"},
        {"scan_interval_seconds": 0},
        {"limits": {"max_nodes": 0}},
        {"cluster_autoscaler": {"listen": "0.0.0.0:7000"}},  # cluster-autoscaler without a serving certificate
    ):
        with pytest.raises(SettingsError):
            parse_autoscaler_config({"autoscaler": {**doc["autoscaler"], **broken}}, extender)
    with pytest.raises(SettingsError):
        parse_autoscaler_config(
            {**doc, "flavours": [{"name": "x", "cpu": "1", "memory": "1Gi", "price_per_hour": 0}]}, extender
        )


def _component(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = _load(path / "kustomization.yaml")
    assert doc["kind"] == "Component"
    return doc


def _json_patch(component: dict[str, Any], kind: str, name: str) -> list[dict[str, Any]]:
    (p,) = [p for p in component["patches"] if p["target"] == {"kind": kind, "name": name}]
    ops: list[dict[str, Any]] = yaml.safe_load(p["patch"])
    return ops


def test_kwok_component_is_the_lab_provider_and_drops_what_only_ca_uses() -> None:
    comp = _component(KWOK)
    settings = parse_autoscaler_config(
        _with_stand_ins(_load(KWOK / "autoscaler.yaml"), ("cert_file", "key_file", "client_ca_file")),
        load_config(AUTOSCALER / "extender.yaml"),
    )
    assert settings.provider == "kwok"
    assert comp["resources"] == ["rbac.yaml"]
    ops = _json_patch(comp, "Deployment", "qos-autoscaler")
    tested = {op["path"]: op["value"] for op in ops if op["op"] == "test"}
    removed = [op["path"] for op in ops if op["op"] == "remove"]
    assert [f"{p}/name" for p in removed] == list(tested)
    assert sorted(tested.values()) == ["expander-tls", "expander-tls", "grpc-expander"]
    dep = _one(AUTOSCALER / "deployment.yaml", "Deployment")
    for path, name in tested.items():  # the indices the patch removes hold what it says they hold
        parts = path.strip("/").split("/")
        node: Any = dep
        for part in parts:
            node = node[int(part)] if part.isdigit() else node[part]
        assert node == name, path
    deleted = {(p["target"]["kind"], p["target"]["name"]) for p in comp["patches"] if "$patch: delete" in p["patch"]}
    assert deleted == {
        ("Service", "qos-autoscaler-expander"),
        ("ClusterRole", "qos-autoscaler-demand"),
        ("ClusterRoleBinding", "qos-autoscaler-demand"),
        ("Role", "qos-autoscaler-demand"),
        ("RoleBinding", "qos-autoscaler-demand"),
    }
    # the kwok provider and the registry-less Component ../offline: config/local and config/kind, never default
    for overlay in ("local", "kind"):
        assert _load(CONFIG / overlay / "kustomization.yaml")["components"] == ["../autoscaler/kwok", "../offline"]
    default = _load(CONFIG / "default" / "kustomization.yaml")
    assert "components" not in default or "../autoscaler/kwok" not in default["components"]


def test_consolidation_component() -> None:
    path = AUTOSCALER / "consolidation"
    comp = _component(path)
    raw = _load(path / "consolidation.yaml")
    settings = parse_consolidation_config(_with_stand_ins(raw, ("cert_file", "key_file", "ca_file")))
    assert settings.enabled and settings.agent_scheme == "https"
    assert settings.agent_port == load_agent_config(str(AGENT / "agent.yaml"), node_name="n").port
    agent = raw["consolidation"]["agent"]
    ops = _json_patch(comp, "Deployment", "qos-autoscaler")
    (arg,) = [op["value"] for op in ops if op["path"].endswith("/args/-")]
    assert arg == "--consolidation-config=/etc/qos-autoscaler/config/consolidation.yaml"
    (mount,) = [op["value"] for op in ops if op["path"].endswith("/volumeMounts/-")]
    (volume,) = [op["value"] for op in ops if op["path"].endswith("/volumes/-")]
    assert volume["secret"]["secretName"] == "qos-autoscaler-agent-client" and mount["name"] == volume["name"]
    for key in ("cert_file", "key_file", "ca_file"):
        assert agent[key].startswith(mount["mountPath"] + "/")
    with pytest.raises(SettingsError):  # enabled over https without a client certificate
        parse_consolidation_config({"consolidation": {"enabled": True}})


# ------------------------------------------------------------------------------------------------ controller


def test_controller_component_turns_the_controller_on_and_nothing_else() -> None:
    """The Component replaces only the overlay key of the base's ConfigMap; the extender layers it over the base
    file (`--config extender.yaml --config controller.yaml`), so the two differ in controller.enabled alone."""
    assert _load(CONFIG / "controller" / "controller.yaml") == {"controller": {"enabled": True}}
    assert _load(CONFIG / "base" / "controller.yaml") == {}
    comp = _component(CONFIG / "controller")
    (gen,) = comp["configMapGenerator"]
    assert gen["name"] == "qos-extender-config" and gen["behavior"] == "merge" and gen["files"] == ["controller.yaml"]
    base_gen = next(g for g in _load(CONFIG / "base" / "kustomization.yaml")["configMapGenerator"]
                    if g["name"] == "qos-extender-config")  # fmt: skip
    assert base_gen["files"] == ["extender.yaml", "controller.yaml"]
    dep = _one(CONFIG / "base" / "deployment.yaml", "Deployment")
    (extender,) = [c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == "extender"]
    args = extender["args"]
    assert args[0] == "serve" and [a for a in args[1:] if not a.startswith("--")] == [
        "/etc/qos-extender/config/extender.yaml",
        "/etc/qos-extender/config/controller.yaml",
    ]
    files = [CONFIG / "base" / "extender.yaml", CONFIG / "controller" / "controller.yaml"]
    raw = _with_stand_ins(deep_merge(_load(files[0]), _load(files[1])), ("cert_file", "key_file", "client_ca_file"))
    on, off = (
        parse_config(raw),
        parse_config(_with_stand_ins(_load(files[0]), ("cert_file", "key_file", "client_ca_file"))),
    )
    assert on.controller.enabled and not off.controller.enabled
    assert on.model_copy(update={"controller": off.controller}) == off


# ------------------------------------------------------------------------------------------------ RBAC vs code

# CoreV1Api method -> what the API server authorizes. A method referenced without a call (handed to a
# Reflector as its list function) is listed and then watched with the same method.
METHODS: dict[str, set[Rule]] = {
    "list_node": {("", "nodes", "list")},
    "read_node": {("", "nodes", "get")},
    "create_node": {("", "nodes", "create")},
    "delete_node": {("", "nodes", "delete")},
    "patch_node": {("", "nodes", "patch")},
    "list_pod_for_all_namespaces": {("", "pods", "list")},
    "read_namespaced_pod": {("", "pods", "get")},
    "create_namespaced_pod": {("", "pods", "create")},
    "delete_namespaced_pod": {("", "pods", "delete")},
    "patch_namespaced_pod": {("", "pods", "patch")},
    "create_namespaced_pod_binding": {("", "pods/binding", "create")},
    "create_namespaced_pod_eviction": {("", "pods/eviction", "create")},
    "create_namespaced_event": {("", "events", "create")},
    "create_namespaced_pod_template": {("", "podtemplates", "create")},
    "delete_namespaced_pod_template": {("", "podtemplates", "delete")},
    # CustomObjectsApi: the only custom resource our code calls is CA's ProvisioningRequest (checked in api_rules)
    "create_namespaced_custom_object": {("autoscaling.x-k8s.io", "provisioningrequests", "create")},
    "delete_namespaced_custom_object": {("autoscaling.x-k8s.io", "provisioningrequests", "delete")},
    "list_namespaced_custom_object": {("autoscaling.x-k8s.io", "provisioningrequests", "list")},
    # AppsV1Api (self._apps): the consolidation flow reads a migrated pod's ReplicaSet (minReadySeconds)
    "read_namespaced_replica_set": {("apps", "replicasets", "get")},
    # CoordinationV1Api (self._leases): the leader election's Lease
    "read_namespaced_lease": {("coordination.k8s.io", "leases", "get")},
    "create_namespaced_lease": {("coordination.k8s.io", "leases", "create")},
    "replace_namespaced_lease": {("coordination.k8s.io", "leases", "update")},
    # CertificatesV1Api: the agents' per-node identities (extender/agent/identity.py, issuer.py)
    "create_certificate_signing_request": {("certificates.k8s.io", "certificatesigningrequests", "create")},
    "read_certificate_signing_request": {("certificates.k8s.io", "certificatesigningrequests", "get")},
    "list_certificate_signing_request": {("certificates.k8s.io", "certificatesigningrequests", "list")},
    "replace_certificate_signing_request_approval": {
        ("certificates.k8s.io", "certificatesigningrequests/approval", "update")
    },
    "replace_certificate_signing_request_status": {
        ("certificates.k8s.io", "certificatesigningrequests/status", "update")
    },
    # RbacAuthorizationV1Api: the issuer's per-node kubelet roles
    "create_cluster_role": {("rbac.authorization.k8s.io", "clusterroles", "create")},
    "read_cluster_role": {("rbac.authorization.k8s.io", "clusterroles", "get")},
    "replace_cluster_role": {("rbac.authorization.k8s.io", "clusterroles", "update")},
    "delete_cluster_role": {("rbac.authorization.k8s.io", "clusterroles", "delete")},
    "list_cluster_role": {("rbac.authorization.k8s.io", "clusterroles", "list")},
    "create_cluster_role_binding": {("rbac.authorization.k8s.io", "clusterrolebindings", "create")},
    "read_cluster_role_binding": {("rbac.authorization.k8s.io", "clusterrolebindings", "get")},
    "replace_cluster_role_binding": {("rbac.authorization.k8s.io", "clusterrolebindings", "update")},
    "delete_cluster_role_binding": {("rbac.authorization.k8s.io", "clusterrolebindings", "delete")},
    # qos-certs (extender/certs/keeper.py): its Secrets, the agents' trust ConfigMap, the webhook's caBundle
    "read_namespaced_secret": {("", "secrets", "get")},
    "create_namespaced_secret": {("", "secrets", "create")},
    "replace_namespaced_secret": {("", "secrets", "update")},
    "read_namespaced_config_map": {("", "configmaps", "get")},
    "create_namespaced_config_map": {("", "configmaps", "create")},
    "replace_namespaced_config_map": {("", "configmaps", "update")},
    "read_mutating_webhook_configuration": {("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get")},
    "replace_mutating_webhook_configuration": {
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "update")
    },
}
_CALL = re.compile(
    r"(?:\b_core|\b_apps|\b_custom|\b_leases|\bself\.(?:certs|core|rbac|admission)|(?<![\w\"/.-])(?:certs|rbac)|CoreV1Api\([^()]*\))"
    r"\.(\w+)(\s*\()?"
)


def api_rules(*files: str) -> set[Rule]:
    """What the CoreV1Api (and CustomObjectsApi) calls of these source files need."""
    out: set[Rule] = set()
    for f in files:
        text = (ROOT / f).read_text()
        other = re.findall(r"\b(\w+V\d\w*Api|CustomObjectsApi)\(", text)
        known = {"CoreV1Api", "CustomObjectsApi", "CoordinationV1Api", "CertificatesV1Api", "RbacAuthorizationV1Api",
                 "AdmissionregistrationV1Api", "AppsV1Api"}  # fmt: skip
        assert set(other) <= known, f"{f} uses {other}: extend METHODS and this check"
        if "CustomObjectsApi" in other:  # the custom-object rules above hold for ProvisioningRequests only
            assert re.search(r'GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"', text), (
                f"{f}: a custom resource other than ProvisioningRequest"
            )
        for method, called in _CALL.findall(text):
            assert method in METHODS, f"{f}: CoreV1Api.{method} is not in METHODS: add what it needs"
            rules = METHODS[method]
            out |= rules if called else rules | {(g, r, "watch") for g, r, v in rules if v == "list"}
    return out


def role_rules(path: Path, name: str, kind: str = "ClusterRole") -> set[Rule]:
    role = _one(path, kind, name)
    return {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def _module_files(start: str) -> set[str]:
    """Source files of the extender modules ``start`` imports, transitively (function-level imports too)."""
    seen: set[str] = set()
    todo = [start]
    files: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        base = ROOT / mod.replace(".", "/")
        path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not path.is_file():
            continue
        files.add(str(path.relative_to(ROOT)))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("extender"):
                assert node.module is not None
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("extender")]
    return files


def _calls_api(f: str) -> bool:
    return bool(re.search(r"V\d\w*Api\(|CustomObjectsApi\(|\b_core\.", (ROOT / f).read_text()))


AUTOSCALER_CORE = ("extender/kube/watch.py", "extender/kube/events.py")  # reflectors, Events
KWOK_PROVIDER = ("extender/autoscaler/providers/kwok.py",)
DEMAND = ("extender/autoscaler/providers/provisioning_request.py",)  # ProvisioningRequests for CA (production)
KWOK = AUTOSCALER / "kwok"
# KwokProvider.set_retiring: only the buying loop calls it (retiring nodes for capacity); consolidation cordons with
# its own grant, and under cluster-autoscaler (a dry-run loop) nothing retires
KWOK_RETIRING = {("", "nodes", "patch")}
CONSOLIDATION = ("extender/consolidation/flow.py", "extender/kube/binder.py")
LEADER = ("extender/controller/leader.py",)  # the Lease of leader_election (every mode)


def test_every_api_calling_module_of_the_autoscaler_is_accounted_for() -> None:
    calling = {f for f in _module_files("extender.processes.autoscaler") if _calls_api(f)}
    assert calling == set(AUTOSCALER_CORE + KWOK_PROVIDER + CONSOLIDATION + DEMAND + LEADER), (
        "a module of the autoscaler calls the API: classify it here and grant what it needs in config/autoscaler"
    )


def test_autoscaler_roles_grant_exactly_what_the_code_calls() -> None:
    core = api_rules(*AUTOSCALER_CORE)
    assert role_rules(AUTOSCALER / "rbac.yaml", "qos-autoscaler") == core
    assert core == {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "events", "create"),
    }
    assert role_rules(KWOK / "rbac.yaml", "qos-autoscaler-kwok") == api_rules(*KWOK_PROVIDER)
    consolidation = api_rules(*CONSOLIDATION) - core - (api_rules(*KWOK_PROVIDER) - KWOK_RETIRING)
    consolidation |= NOT_A_CALL["owners.HANDED_OVER_RESOURCES"]  # the hand-over's blockOwnerDeletion
    assert role_rules(AUTOSCALER / "consolidation" / "rbac.yaml", "qos-autoscaler-consolidation") == consolidation
    # The production mode's demand for CA: pods patch cluster-wide, its requests and templates in its namespace only.
    demand = role_rules(AUTOSCALER / "rbac.yaml", "qos-autoscaler-demand") | role_rules(
        AUTOSCALER / "rbac.yaml", "qos-autoscaler-demand", "Role"
    )
    assert demand == api_rules(*DEMAND)
    assert role_rules(AUTOSCALER / "rbac.yaml", "qos-autoscaler-demand") == {("", "pods", "patch")}
    assert _one(AUTOSCALER / "rbac.yaml", "Role", "qos-autoscaler-demand")["metadata"]["namespace"] == "kube-qos-system"
    # The Lease: in its namespace only, get/update of its own name only (create cannot name the object).
    leader = _one(AUTOSCALER / "rbac.yaml", "Role", "qos-autoscaler-leader")
    assert (
        role_rules(AUTOSCALER / "rbac.yaml", "qos-autoscaler-leader", "Role")
        == api_rules(*LEADER)
        == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    )
    assert leader["metadata"]["namespace"] == "kube-qos-system"
    deployed = parse_autoscaler_config(
        _with_stand_ins(_load(AUTOSCALER / "autoscaler.yaml"), ("cert_file", "key_file", "client_ca_file")),
        load_config(AUTOSCALER / "extender.yaml"),
    ).leader_election
    assert deployed.enabled and deployed.lease_namespace is None  # the pod's own: kube-qos-system
    for rule in leader["rules"]:
        assert rule.get("resourceNames") == (None if rule["verbs"] == ["create"] else [deployed.lease_name]), rule
    # Each role is bound to the autoscaler's ServiceAccount and to nothing else.
    for path, name, kind in (
        (AUTOSCALER / "rbac.yaml", "qos-autoscaler", "ClusterRoleBinding"),
        (AUTOSCALER / "rbac.yaml", "qos-autoscaler-demand", "ClusterRoleBinding"),
        (AUTOSCALER / "rbac.yaml", "qos-autoscaler-demand", "RoleBinding"),
        (AUTOSCALER / "rbac.yaml", "qos-autoscaler-leader", "RoleBinding"),
        (KWOK / "rbac.yaml", "qos-autoscaler-kwok", "ClusterRoleBinding"),
        (AUTOSCALER / "consolidation" / "rbac.yaml", "qos-autoscaler-consolidation", "ClusterRoleBinding"),
    ):
        binding = _one(path, kind, name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "qos-autoscaler", "namespace": "kube-qos-system"}
        ]


CLUSTER_AUTOSCALER = CONFIG / "cluster-autoscaler"
CA_CLOUD_PROVIDER_RBAC = CLUSTER_AUTOSCALER / "cloud-provider" / "cloud-provider.yaml"
# config/cluster-autoscaler's roles that are cluster-autoscaler's own (what CA 1.35 reads and writes, bound to its
# ServiceAccount cluster-autoscaler), not our code's: excluded from the code-grant matching. That they are bound to
# CA's ServiceAccount and to nothing of ours is checked below; what they grant is upstream's business.
CLUSTER_AUTOSCALER_OWN = {("ClusterRole", "qos-cluster-autoscaler"), ("Role", "cluster-autoscaler")}


def _function_calls(path: Path, function: str) -> set[str]:
    """Names called inside ``function`` of a source file."""
    tree = ast.parse(path.read_text())
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function]
    return {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_cluster_autoscaler_overlay_grants_the_autoscaler_exactly_what_its_code_calls() -> None:
    """config/cluster-autoscaler: the sidecar serving CA's externalgrpc provider writes kwok Nodes through ClusterRole
    qos-autoscaler-cloud-provider (the expander Component removed qos-autoscaler-kwok); CA's own roles are classified,
    bound to CA only, and not matched against our code."""
    kustomization = _load(CLUSTER_AUTOSCALER / "kustomization.yaml")
    assert kustomization["resources"] == ["../default", "cluster-autoscaler.yaml"]
    assert kustomization["components"] == ["cloud-provider"]
    assert _component(CLUSTER_AUTOSCALER / "cloud-provider")["resources"] == ["cloud-provider.yaml"]
    # Used: with cloud_provider set the sidecar builds KwokProvider (create_node / delete_node) as the node groups'
    # backend (main._cloud_provider); the planning loop itself gets no provider (provider cluster-autoscaler).
    raw = _load(CLUSTER_AUTOSCALER / "cloud-provider" / "autoscaler.yaml")["autoscaler"]
    assert raw["provider"] == "cluster-autoscaler" and "cloud_provider" in raw["cluster_autoscaler"]  # backend: kwok
    assert "KwokProvider" in _function_calls(ROOT / "extender" / "processes" / "sidecar.py", "_cloud_provider")
    # Only create / delete: set_retiring (patch_node) is called by the buying loop only, and under CA the loop is a
    # dry run (it never retires); the cloud provider's backend creates and deletes the nodes CA asks for.
    kwok = api_rules(*KWOK_PROVIDER) - KWOK_RETIRING
    assert kwok == {("", "nodes", "create"), ("", "nodes", "delete")}
    # Granted: exactly that, bound to the autoscaler's ServiceAccount only.
    assert role_rules(CA_CLOUD_PROVIDER_RBAC, "qos-autoscaler-cloud-provider") == kwok
    binding = _one(CA_CLOUD_PROVIDER_RBAC, "ClusterRoleBinding", "qos-autoscaler-cloud-provider")
    assert binding["roleRef"]["name"] == "qos-autoscaler-cloud-provider"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qos-autoscaler", "namespace": "kube-qos-system"}]
    # In this overlay the autoscaler holds qos-autoscaler (reflectors, Events) + qos-autoscaler-cloud-provider.
    assert role_rules(AUTOSCALER / "rbac.yaml", "qos-autoscaler") | kwok == (
        api_rules(*AUTOSCALER_CORE, *KWOK_PROVIDER) - KWOK_RETIRING
    )
    # Every role of the overlay's own files is either matched against our code above or cluster-autoscaler's.
    files = (CLUSTER_AUTOSCALER / "cluster-autoscaler.yaml", CA_CLOUD_PROVIDER_RBAC)
    docs = [d for f in files for d in _docs(f)]
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    assert roles == {("ClusterRole", "qos-autoscaler-cloud-provider")} | CLUSTER_AUTOSCALER_OWN
    ca_sa = {"kind": "ServiceAccount", "name": "cluster-autoscaler", "namespace": "kube-qos-system"}
    ca_pod = _one(CLUSTER_AUTOSCALER / "cluster-autoscaler.yaml", "Deployment")["spec"]["template"]["spec"]
    assert ca_pod["serviceAccountName"] == ca_sa["name"]
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    for b in bindings:
        ref = (b["roleRef"]["kind"], b["roleRef"]["name"])
        assert (ref in CLUSTER_AUTOSCALER_OWN) == (b["subjects"] == [ca_sa]), (b["metadata"]["name"], b["subjects"])
        assert b["kind"] == ("RoleBinding" if ref[0] == "Role" else "ClusterRoleBinding"), b["metadata"]["name"]
    assert {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == roles  # none unbound


# Grants no API call of ours needs, each named by what needs it instead: setting blockOwnerDeletion on a handed-over
# pod under OwnerReferencesPermissionEnforcement (extender/core/owners.py).
NOT_A_CALL = {
    "owners.HANDED_OVER_RESOURCES": {(g, f"{r}/finalizers", "update") for g, r in HANDED_OVER_RESOURCES.values()},
}


def test_every_rule_names_the_calls_that_justify_it() -> None:
    """The comment block right above each rule names CoreV1Api methods; they are exactly the rule's needs."""
    for path in (
        AUTOSCALER / "rbac.yaml",
        KWOK / "rbac.yaml",
        AUTOSCALER / "consolidation" / "rbac.yaml",
        CA_CLOUD_PROVIDER_RBAC,
    ):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("- apiGroups:"):
                j = i
                while lines[j - 1].startswith("# "):
                    j -= 1
                comment = " ".join(lines[j:i])
                assert comment, f"{path}:{i}: no comment above the rule"
                named = {m for m in METHODS if re.search(rf"\b{m}\b", comment)}
                reasons = {k for k in NOT_A_CALL if k in comment}
                assert named or reasons, f"{path}:{i}: the comment names no API call"
                rule = yaml.safe_load("\n".join(lines[i : i + 3]))[0]
                granted = {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
                needed = set().union(*(METHODS[m] for m in named))
                # a reason that is not a call covers what it needs in this rule's API groups
                needed |= {x for k in reasons for x in NOT_A_CALL[k] if x[0] in rule["apiGroups"]}
                needed |= {(g, r, "watch") for g, r, v in needed if v == "list" and "reflector" in comment}
                assert granted == needed, (path, i, granted, needed)


CERTS = ROOT / "config" / "certs"


def test_certs_rbac_matches_the_code() -> None:
    """qos-certs' roles grant exactly what the keeper calls (resourceNames aside), and the named Secrets are
    exactly the ones config/certs/certs.yaml keeps plus the chart's externalgrpc pair."""
    from extender.certs.settings import CertsConfig
    from extender.settings import load_settings

    calling = {f for f in _module_files("extender.processes.certs") if _calls_api(f)}
    assert calling == {"extender/certs/keeper.py"}, calling
    roles = [d for d in _docs(CERTS / "rbac.yaml") if d["kind"] in ("Role", "ClusterRole")]
    assert {d["metadata"]["name"] for d in roles} == {"qos-certs"}
    granted = {
        (g, r, v)
        for d in roles
        for rule in d["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == api_rules("extender/certs/keeper.py")
    config = load_settings(CertsConfig, yaml.safe_load((CERTS / "certs.yaml").read_text())["certs"], "certs.yaml")
    named: dict[str, set[str]] = {}
    for d in yaml.safe_load_all((CERTS / "rbac.yaml").read_text()):
        if d["kind"] == "Role":
            for rule in d["rules"]:
                if "secrets" in rule["resources"] and "resourceNames" in rule:
                    named.setdefault(d["metadata"]["namespace"], set()).update(rule["resourceNames"])
    kept: dict[str, set[str]] = {}
    for ns, name in [(a.namespace, a.secret) for a in config.authorities] + [
        (c.namespace, c.secret) for c in config.certificates
    ]:
        kept.setdefault(ns, set()).add(name)
    extra = {"qos-autoscaler-cloud-provider-tls", "cluster-autoscaler-externalgrpc-client"}  # the chart's externalgrpc
    assert named["kube-qos-agent"] == kept["kube-qos-agent"]
    assert named["kube-qos-system"] - extra == kept["kube-qos-system"]


AGENT_CALLS = ("extender/agent/identity.py", "extender/agent/server.py")  # CSRs; the pod read before a checkpoint
ISSUER_CALLS = ("extender/agent/issuer.py",)
# What the API server checks besides the calls (certificates.k8s.io and RBAC escalation prevention): approving
# CSRs of a signer, signing for ours, and holding what the per-node roles grant (no `escalate`).
ISSUER_SIGNERS = {
    ("approve", "kube-qos-extender.io/agent"),
    ("approve", "kubernetes.io/kube-apiserver-client"),
    ("sign", "kube-qos-extender.io/agent"),
}


def test_agent_rbac_matches_the_code(agent_ds: dict[str, Any]) -> None:
    calling = {f for f in _module_files("extender.processes.agent") if _calls_api(f)}
    assert calling == {"extender/agent/events.py", "extender/agent/backends/simulated.py", *AGENT_CALLS}
    cfg = load_agent_config(str(AGENT / "agent.yaml"), node_name="n")
    assert cfg.backend == "kubelet"  # simulated.py (pods get/patch) is not used
    run_agent = (ROOT / "extender" / "agent" / "server.py").read_text()
    gate = 'config.events and config.backend != "criu" and (config.kubeconfig or os.environ.get("KUBECONFIG"))'
    assert gate in run_agent, (
        "the agent's Event gate changed: if it now posts Events in-cluster, grant `events create` to "
        "ServiceAccount qos-agent (config/agent/rbac.yaml)"
    )
    env = {e["name"] for e in _container(agent_ds, "agent")["env"]}
    assert cfg.kubeconfig is None and "KUBECONFIG" not in env  # so events.py is not reached
    assert cfg.identity.enabled and cfg.migration.check_pods  # so identity.py and server.py's pod read are
    assert (
        role_rules(AGENT / "rbac.yaml", "qos-agent")
        == api_rules(*AGENT_CALLS)
        == {
            ("certificates.k8s.io", "certificatesigningrequests", "create"),
            ("certificates.k8s.io", "certificatesigningrequests", "get"),
            ("", "pods", "get"),
        }
    )
    binding = _one(AGENT / "rbac.yaml", "ClusterRoleBinding", "qos-agent")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qos-agent", "namespace": "kube-qos-agent"}]
    # The kubelet: POST /checkpoint/... with this node's client certificate = create nodes/checkpoint (kubelet
    # pkg/kubelet/server/auth.go: POST -> create, /checkpoint/* -> subresource checkpoint), granted per node by
    # the issuer (identity.node_role), never by a static role: no rule of the manifests names nodes/checkpoint
    # for the agents.
    kubelet = (ROOT / "extender" / "agent" / "backends" / "kubelet.py").read_text()
    assert 'f"https://{host}:{port}/checkpoint/{path}' in kubelet and "session.post(url" in kubelet
    assert "load_cert_chain(self.config.cert_file, self.config.key_file)" in kubelet  # a client cert, no token
    from extender.agent.identity import node_role

    assert node_role("n1")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/checkpoint"], "verbs": ["create"], "resourceNames": ["n1"]}
    ]


def test_issuer_rbac_matches_the_code() -> None:
    # identity.py: the issuer uses its pure verdict and signing; its Requester (the agent's CSR calls) is not run
    calling = {f for f in _module_files("extender.processes.issuer") if _calls_api(f)}
    assert calling == {*ISSUER_CALLS, "extender/agent/identity.py"}, calling
    assert "Requester" not in (ROOT / ISSUER_CALLS[0]).read_text()
    needed = api_rules(*ISSUER_CALLS)
    cluster = role_rules(AGENT / "rbac.yaml", "qos-agent-issuer")
    namespaced = role_rules(AGENT / "rbac.yaml", "qos-agent-issuer", "Role")
    signers = {(v, n) for r in _one(AGENT / "rbac.yaml", "ClusterRole", "qos-agent-issuer")["rules"]
               if r["resources"] == ["signers"] for v in r["verbs"] for n in r["resourceNames"]}  # fmt: skip
    assert signers == ISSUER_SIGNERS
    extra = {("certificates.k8s.io", "signers", "approve"), ("certificates.k8s.io", "signers", "sign"),
             ("", "nodes/checkpoint", "create")}  # fmt: skip
    assert namespaced == {("", "pods", "get")}  # the requesting agent pod, in the agents' namespace only
    assert cluster | namespaced == needed | extra, (cluster | namespaced) ^ (needed | extra)
    assert _one(AGENT / "rbac.yaml", "Role", "qos-agent-issuer")["metadata"]["namespace"] == "kube-qos-agent"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        b = _one(AGENT / "rbac.yaml", kind, "qos-agent-issuer")
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "qos-agent-issuer", "namespace": "kube-qos-agent"}]
    dep = _one(AGENT / "issuer.yaml", "Deployment", "qos-agent-issuer")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "qos-agent-issuer" and not _container(dep, "issuer").get("ports")
    from extender.agent.settings import IssuerConfig

    cfg = IssuerConfig()
    assert _mounted_from(dep, "issuer", cfg.ca_key_file)["volume"]["secret"]["secretName"] == "qos-agent-issuer-ca"


# ------------------------------------------------------------------------------------------- qos-scheduler


def test_qos_scheduler_mounts_only_the_secrets_its_config_uses() -> None:
    """The scheduler calls the sidecar's verbs-only loopback listener over plain HTTP (config/base
    kube-scheduler.yaml), so it needs no client certificate: a Secret mounted into it anyway is a credential
    for the extender's TLS port held by a container that never uses it."""
    dep = _one(CONFIG / "base" / "deployment.yaml", "Deployment", "qos-scheduler")
    sched = _load(CONFIG / "base" / "kube-scheduler.yaml")
    files = [
        path
        for ext in sched.get("extenders") or []
        for path in (ext.get("tlsConfig") or {}).values()
        if isinstance(path, str) and path.startswith("/")
    ]
    assert all(e["urlPrefix"].startswith("http://127.0.0.1:") for e in sched["extenders"]) and not files
    secrets = {n: m for n, m in _mounts(dep, "kube-scheduler").items() if "secret" in m["volume"]}
    # its own API token (test_each_qos_scheduler_container_has_its_own_api_identity) is no certificate
    secrets.pop("scheduler-token")
    used = {n for n, m in secrets.items() if any(f.startswith(m["mountPath"].rstrip("/") + "/") for f in files)}
    assert set(secrets) == used, f"kube-scheduler mounts Secrets its config does not use: {sorted(set(secrets) - used)}"


def test_our_control_plane_prefers_nodes_consolidation_will_not_empty() -> None:
    """qos-scheduler and qos-autoscaler stay off the batch node group when they can: a pod of ours on an
    under-used batch node would keep the node consolidation is emptying (and the e2e would find no batch node
    free of product pods to consolidate)."""
    want = {"key": "qos.kube-qos-extender.io/node-group", "operator": "NotIn", "values": ["batch"]}
    for path in (CONFIG / "base" / "deployment.yaml", CONFIG / "autoscaler" / "deployment.yaml"):
        (deployment,) = [d for d in _docs(path) if d["kind"] == "Deployment"]
        preferred = deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert any(want in p["preference"]["matchExpressions"] for p in preferred), path


def test_the_controller_role_grants_its_pod_calls_and_the_local_copy_is_the_same() -> None:
    """The QoS controller's pod verbs (release patch, re-queue get/delete/create, the watch the extender shares)
    are granted by config/controller's ClusterRole, not more; hack/manifests' copy for local-up's extender (its
    client-certificate user) grants the same. A copy that lagged once left a re-queue refused with 403 in CI."""
    text = (ROOT / "extender" / "controller" / "loop.py").read_text()
    called = set(re.findall(r"self\.core\.(\w+)\(", text))
    pods = {rule for rule in set().union(*(METHODS[m] for m in called if m in METHODS)) if rule[1] == "pods"}
    assert {v for _, r, v in pods if r == "pods"} == {"get", "delete", "create", "patch"}
    assert "create_namespaced_pod_eviction" in called  # QoS preemption: pods/eviction, granted below the pods rule
    granted = role_rules(CONFIG / "controller" / "clusterrole.yaml", "qos-extender-controller")
    assert {rule for rule in granted if rule[1] == "pods"} == pods | {("", "pods", "list"), ("", "pods", "watch")}
    local = role_rules(ROOT / "hack" / "manifests" / "qos-controller-rbac.yaml", "qos-extender-controller")
    assert local == granted


# The extender process without the QoS controller (config/base): the modules `serve` reaches that call the API
# server. The controller's (loop.py, leader.py, colocation) are config/controller's roles, tested above and below.
EXTENDER_SERVE = (
    "extender/kube/watch.py",  # the snapshot's reflectors: nodes, pods
    "extender/kube/binder.py",  # the bind verb's Binding, a 409 resolved by reading the pod
    "extender/kube/events.py",  # malformed-annotation Events
    "extender/processes/webhook.py",  # /bind reads a pod its snapshot does not hold yet
)
EXTENDER_CONTROLLER = {
    "extender/controller/loop.py",
    "extender/controller/leader.py",
    "extender/colocation/controller.py",
}


def test_extender_role_grants_exactly_what_serve_calls() -> None:
    """config/base's ClusterRole qos-extender is exactly the calls of the extender process without the
    controller, both ways: a call not granted fails in the cluster, a grant not called is privilege for nothing
    (issue 29 cut nodes get, the legacy `bindings`, events patch and events.k8s.io that way)."""
    calling = {f for f in _module_files("extender.processes.webhook") if _calls_api(f)}
    assert calling == set(EXTENDER_SERVE) | EXTENDER_CONTROLLER, "a new API-calling module: account for it here"
    assert role_rules(CONFIG / "base" / "clusterrole.yaml", "qos-extender") == api_rules(*EXTENDER_SERVE)
    # the controller's events are core/v1 creates too: nothing patches an Event
    assert ("", "events", "patch") not in role_rules(
        CONFIG / "controller" / "clusterrole.yaml", "qos-extender-controller"
    )


SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# role -> the only ServiceAccount (in kube-qos-system) it may be bound to, in config/base and config/controller
ROLE_HOLDER = {
    "system:kube-scheduler": "qos-scheduler",
    "system:volume-scheduler": "qos-scheduler",
    "extension-apiserver-authentication-reader": "qos-scheduler",
    "qos-scheduler-leader-election": "qos-scheduler",
    "qos-extender": "qos-extender",
    "qos-extender-controller": "qos-extender",
    "qos-extender-controller-leader-election": "qos-extender",
    "qos-extender-slack": "qos-extender",  # config/controller/slack: the slack controller runs in the extender
}


def test_each_qos_scheduler_container_has_its_own_api_identity() -> None:
    """The extender sidecar no longer shares kube-scheduler's identity (issue 29): the pod's ServiceAccount is
    the extender's (its bound token projected into the extender alone), kube-scheduler reads its own token
    Secret, nothing is automounted, and each role is bound to the one identity that uses it."""
    dep = _one(CONFIG / "base" / "deployment.yaml", "Deployment", "qos-scheduler")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "qos-extender" and spec["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    containers = {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}
    assert set(containers) == {"extender", "kube-scheduler"}
    at_sa_path = {
        name: [volumes[m["name"]] for m in c["volumeMounts"] if m["mountPath"] == SA_PATH]
        for name, c in containers.items()
    }
    (ext,) = at_sa_path["extender"]
    assert any("serviceAccountToken" in s for s in ext["projected"]["sources"])
    (sched,) = at_sa_path["kube-scheduler"]
    token_secret = _one(CONFIG / "base" / "serviceaccount.yaml", "Secret", sched["secret"]["secretName"])
    assert token_secret["type"] == "kubernetes.io/service-account-token"
    assert token_secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "qos-scheduler"
    # no other container mounts either credential
    for name, c in containers.items():
        mounted = {m["name"] for m in c["volumeMounts"]}
        assert mounted & {"extender-token", "scheduler-token"} == {
            f"{'extender' if name == 'extender' else 'scheduler'}-token"
        }
    sas = {
        d["metadata"]["name"] for d in _docs(CONFIG / "base" / "serviceaccount.yaml") if d["kind"] == "ServiceAccount"
    }
    assert sas == {"qos-extender", "qos-scheduler"}
    seen = set()
    for path in (CONFIG / "base" / "rbac.yaml", *sorted((CONFIG / "controller").rglob("*.yaml"))):
        for d in _docs(path):
            if not isinstance(d, dict) or d.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            role = d["roleRef"]["name"]
            assert role in ROLE_HOLDER, f"{path}: {role} is bound to someone: name its holder in ROLE_HOLDER"
            holders = {(s["kind"], s.get("namespace"), s["name"]) for s in d["subjects"]}
            assert holders == {("ServiceAccount", "kube-qos-system", ROLE_HOLDER[role])}, (path, role, holders)
            seen.add(role)
    assert seen == set(ROLE_HOLDER)
