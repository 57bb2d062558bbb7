"""charts/kube-qos-extender against config/: `helm lint`, `helm template`, and the same objects as kustomize.

The chart keeps no copy of the manifests: its files/ link to config/'s directories and its templates choose and
adjust those files. What keeps the two installs equal is this test: for each value set below, `helm template`
must render exactly the objects `kubectl kustomize` renders for the kustomization with the same parts (every
field, after removing what only differs by tool: Helm's own labels, the ConfigMap hash suffixes kustomize adds,
the checksum annotation that rolls the chart's pods on a config change, and the chart's uninstall hook).

Needs Helm from hack/build-helm.sh and kubectl from hack/build-tools.sh ($QOS_CACHE/v*/bin, or $QOS_HELM /
$QOS_KUBECTL): FAILS, never skips, without them (`make unit` builds both first).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.autoscaler.settings import parse_autoscaler_config
from extender.settings.extender import deep_merge, parse_config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "kube-qos-extender"
CONFIG = ROOT / "config"

# kustomize's configMapGenerator names (a content hash is appended to each)
GENERATED = ("qos-scheduler-config", "qos-extender-config", "qos-grafana-dashboard", "qos-agent-config",
             "qos-autoscaler-config", "qos-certs-config")  # fmt: skip
_HASHED = re.compile(r"^(" + "|".join(map(re.escape, GENERATED)) + r")-[a-z0-9]{10}$")
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
HOOK = "helm.sh/hook"
PART_OF = "app.kubernetes.io/part-of"

Key = tuple[str, str, str]  # kind, namespace, name


def _tool(name: str, env: str, hint: str) -> str:
    given = os.environ.get(env)
    cache = Path(os.environ.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender")))
    for c in [given] if given else sorted(cache.glob(f"v*/bin/{name}"), reverse=True):
        if c and os.access(c, os.X_OK):
            return str(c)
    pytest.fail(f"{name} not found: run {hint} (or set {env})", pytrace=False)


@pytest.fixture(scope="module")
def helm() -> str:
    return _tool("helm", "QOS_HELM", "hack/build-helm.sh (make helm)")


@pytest.fixture(scope="module")
def kubectl() -> str:
    return _tool("kubectl", "QOS_KUBECTL", "hack/build-tools.sh (make tools)")


def _run(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr[-4000:]}")
    return out.stdout


def _sets(values: dict[str, str]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


# what a cluster with prometheus-operator serves: the chart renders each of these kinds only where the cluster has it
# (`helm install` asks the cluster; `helm template` knows only what --api-versions says)
MONITORING = tuple(f"monitoring.coreos.com/v1/{kind}" for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"))
WITH_MONITORING = [a for api in MONITORING for a in ("--api-versions", api)]


def render(
    helm: str, values: dict[str, str] | None = None, extra: list[str] | None = None, *, apis: list[str] | None = None
) -> list[dict[str, Any]]:
    """`helm template` as for a cluster with prometheus-operator's CRDs (config/default's prerequisite), unless
    ``apis`` says which --api-versions to pass instead."""
    args = WITH_MONITORING if apis is None else apis
    text = _run([helm, "template", "qos", str(CHART), *_sets(values or {}), *(extra or []), *args])
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize(
    kubectl: str, tmp_path: Path, resources: list[str], components: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """`kubectl kustomize` of a kustomization composing config/'s parts (paths relative to config/)."""
    rel = os.path.relpath(CONFIG, tmp_path)
    k = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
         "resources": [f"{rel}/{r}" for r in resources], "components": [f"{rel}/{c}" for c in components]}  # fmt: skip
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return [d for d in yaml.safe_load_all(_run([kubectl, "kustomize", str(tmp_path)])) if d]


def _unhash(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unhash(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unhash(v) for v in value]
    if isinstance(value, str):
        m = _HASHED.match(value)
        return m.group(1) if m else value
    return value


def normalise(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The objects by (kind, namespace, name), with what only differs by tool removed."""
    out: dict[Key, dict[str, Any]] = {}
    for doc in docs:
        d = _unhash(copy.deepcopy(doc))
        meta = d["metadata"]
        if HOOK in (meta.get("annotations") or {}):
            continue  # the chart's uninstall hook: no kustomize counterpart (tested below)
        for label in HELM_LABELS:
            (meta.get("labels") or {}).pop(label, None)
        template = (d.get("spec") or {}).get("template")
        if isinstance(template, dict):
            ann = template.get("metadata", {}).get("annotations") or {}
            ann.pop("checksum/config", None)
            if not ann:
                template.get("metadata", {}).pop("annotations", None)
        key = (d["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"{key} rendered twice"
        out[key] = d
    return out


def assert_same(chart: list[dict[str, Any]], kust: list[dict[str, Any]]) -> None:
    c, k = normalise(chart), normalise(kust)
    assert sorted(c) == sorted(k), (
        f"only in the chart: {sorted(set(c) - set(k))}; only in kustomize: {sorted(set(k) - set(c))}"
    )
    for key in sorted(k):
        # the chart labels every object part-of kube-qos-extender; kustomize only those of kustomizations that say
        # so (config/cluster-autoscaler/cloud-provider's Component objects do not)
        if PART_OF not in (k[key]["metadata"].get("labels") or {}):
            assert c[key]["metadata"]["labels"].pop(PART_OF) == "kube-qos-extender"
        assert c[key] == k[key], f"{key} differs:\nchart: {yaml.safe_dump(c[key])}\nkustomize: {yaml.safe_dump(k[key])}"


# ------------------------------------------------------------------------------------------ lint


def test_helm_lint_strict(helm: str) -> None:
    for values in (
        {},
        {"autoscaler.mode": "externalgrpc", "colocation.enabled": "true", "criticalPriorityQuota.enabled": "true"},
        {"agent.enabled": "false"},
    ):
        out = _run([helm, "lint", "--strict", str(CHART), *_sets(values)])
        assert "0 chart(s) failed" in out, out


def test_the_packaged_chart_carries_config_files_and_renders_the_same(helm: str, tmp_path: Path) -> None:
    """`helm package` follows files/' links into config/: the .tgz a user installs holds those files (and not
    config/'s kustomize plumbing or lab parts, .helmignore) and renders exactly what the chart directory does."""
    out = _run([helm, "package", str(CHART), "-d", str(tmp_path)])
    (tgz,) = tmp_path.glob("kube-qos-extender-*.tgz")
    assert str(tgz) in out
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
    assert "kube-qos-extender/files/base/deployment.yaml" in names
    assert not [n for n in names if n.endswith("kustomization.yaml") or "/kwok/" in n or "/consolidation/" in n]
    for values in ({}, {"autoscaler.mode": "externalgrpc", "colocation.enabled": "true"}):
        packaged = _run([helm, "template", "qos", str(tgz), *_sets(values), *WITH_MONITORING])
        assert packaged == _run([helm, "template", "qos", str(CHART), *_sets(values), *WITH_MONITORING])


# --------------------------------------------------------------------------- the same objects as config/


def test_default_values_render_config_default(helm: str, kubectl: str, tmp_path: Path) -> None:
    """The production defaults ARE config/default: base + controller + agent + autoscaler (expander)."""
    assert_same(render(helm), kustomize(kubectl, tmp_path, ["default"]))


def test_scheduler_only_renders_config_base(helm: str, kubectl: str, tmp_path: Path) -> None:
    values = {"controller.enabled": "false", "agent.enabled": "false", "autoscaler.mode": "off",
              "certificates.mode": "manual"}  # fmt: skip
    assert_same(render(helm, values), kustomize(kubectl, tmp_path, ["base"]))


def test_agent_alone_renders_config_agent(helm: str, kubectl: str, tmp_path: Path) -> None:
    values = {"scheduler.enabled": "false", "controller.enabled": "false", "autoscaler.mode": "off",
              "certificates.mode": "manual"}  # fmt: skip
    assert_same(render(helm, values), kustomize(kubectl, tmp_path, ["agent"]))


def test_crio_runtime_renders_the_agents_crio_component(helm: str, kubectl: str, tmp_path: Path) -> None:
    """agent.containerRuntime cri-o = config/default + config/agent/crio (the same patch file, applied by the chart
    the way kustomize applies it); anything but containerd or cri-o is refused with the reason."""
    got = render(helm, {"agent.containerRuntime": "cri-o"})
    assert_same(got, kustomize(kubectl, tmp_path, ["default"], ("agent/crio",)))
    (ds,) = [d for d in got if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "qos-agent"]
    assert "--container-runtime=cri-o" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    out = subprocess.run([helm, "template", "qos", str(CHART), "--set", "agent.containerRuntime=podman"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode != 0 and "agent.containerRuntime must be containerd or cri-o" in out.stderr, out.stderr


def test_externalgrpc_renders_the_cloud_provider_component(helm: str, kubectl: str, tmp_path: Path) -> None:
    """autoscaler.mode externalgrpc = config/default + config/cluster-autoscaler/cloud-provider (one replica,
    Recreate, port 8086 and its certificate, the Service, the kwok backend's node writes)."""
    got = render(helm, {"autoscaler.mode": "externalgrpc"})
    kust = kustomize(kubectl, tmp_path, ["default"], ("cluster-autoscaler/cloud-provider",))
    # qos-certs also keeps the externalgrpc pair there (test_certificates_cover_every_mounted_secret)
    assert_same(
        [d for d in got if d["metadata"]["name"] != "qos-certs-config"],
        [d for d in kust if not d["metadata"]["name"].startswith("qos-certs-config")],
    )


def test_colocation_adds_the_slack_component_and_turns_slack_on(helm: str, kubectl: str, tmp_path: Path) -> None:
    """colocation.enabled = config/default + config/controller/slack (nodes/status patch), and the extender's
    settings turn the slack controller on (the kustomize Component leaves that to your overlay's config)."""
    got = render(helm, {"colocation.enabled": "true", "colocation.prometheusUrl": "http://prom.mon.svc:9090"})
    kust = kustomize(kubectl, tmp_path, ["default"], ("controller/slack",))
    (cm,) = [d for d in got if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "qos-extender-config"]
    cfg = _settings(cm["data"]["extender.yaml"], cm["data"]["controller.yaml"])
    assert cfg.slack.enabled and cfg.controller.enabled and cfg.slack.prometheus_url == "http://prom.mon.svc:9090"
    assert cfg.slack.model_path is not None and cfg.slack.model_path.startswith("/tmp/")  # the only writable path
    without_config = [d for d in got if d is not cm]
    assert_same(without_config, [d for d in kust if not d["metadata"]["name"].startswith("qos-extender-config")])
    assert any(d["kind"] == "ClusterRole" and d["metadata"]["name"] == "qos-extender-slack" for d in got)


def test_autoscaler_off_and_monitoring_off_leave_their_objects_out(helm: str) -> None:
    docs = render(helm, {"autoscaler.mode": "off", "monitoring.serviceMonitors": "false",
                         "monitoring.prometheusRules": "false", "monitoring.grafanaDashboard": "false"})  # fmt: skip
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert not [d for d in docs if "autoscaler" in d["metadata"]["name"]]
    assert not [d for d in docs if d["metadata"]["name"] == "qos-grafana-dashboard"]
    assert any(d["kind"] == "Deployment" and d["metadata"]["name"] == "qos-scheduler" for d in docs)


def test_default_values_on_a_cluster_without_prometheus_operator(helm: str, kubectl: str, tmp_path: Path) -> None:
    """`helm install` with default values works on a bare cluster: each prometheus-operator kind is rendered only
    where the cluster serves it (everything else is config/default's); the dashboard ConfigMap needs no CRD."""
    operator = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    bare = render(helm, apis=[])
    assert not {d["kind"] for d in bare} & operator
    assert_same(bare, [d for d in kustomize(kubectl, tmp_path, ["default"]) if d["kind"] not in operator])
    assert any(d["metadata"]["name"] == "qos-grafana-dashboard" for d in bare)
    only_rules = render(helm, apis=["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"])
    assert {d["kind"] for d in only_rules} & operator == {"PrometheusRule"}


# ----------------------------------------------------------------------------------- values that adjust


def _settings(*texts: str) -> Any:
    """The extender settings of ConfigMap texts (deep-merged in order, as `serve --config A --config B` does), parsed
    by the project's own loader; ``server`` is left out: its certificate paths exist only inside the pod."""
    merged: dict[str, Any] = {}
    for text in texts:
        merged = deep_merge(merged, yaml.safe_load(text) or {})
    merged.pop("server", None)
    return parse_config(merged)


def _configmap(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    data: dict[str, str] = cm["data"]
    return data


def test_flavour_catalogue_is_set_once_for_extender_and_autoscaler(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    flavours = [
        {"name": "c5.large", "cpu": "2", "memory": "4Gi", "pods": 110, "price_per_hour": 0.085},
        {"name": "r5.xlarge", "cpu": "4", "memory": "32Gi", "pods": 110, "price_per_hour": 0.252},
    ]
    values.write_text(yaml.safe_dump({"flavours": flavours}))
    docs = render(helm, extra=["-f", str(values)])
    ext = _configmap(docs, "qos-extender-config")
    cfg = _settings(ext["extender.yaml"], ext["controller.yaml"])
    assert [f.name for f in cfg.flavours] == ["c5.large", "r5.xlarge"]
    # the rest of config/base's extender.yaml is kept
    assert yaml.safe_load(ext["extender.yaml"])["server"]["loopback_verbs_port"] == 8081
    assert cfg.scheduling.marker_resource is None and cfg.controller.enabled
    auto = _configmap(docs, "qos-autoscaler-config")
    ext2 = _settings(auto["extender.yaml"])
    assert [f.name for f in ext2.flavours] == ["c5.large", "r5.xlarge"]
    stand_in = str(CHART / "Chart.yaml")  # the pod's certificate paths, by a file that exists here
    raw = yaml.safe_load(auto["autoscaler.yaml"])
    for section in (raw["autoscaler"]["metrics"], raw["autoscaler"]["cluster_autoscaler"]):
        for k in ("cert_file", "key_file", "client_ca_file"):
            if k in section:
                section[k] = stand_in
    settings = parse_autoscaler_config(raw, ext2)
    assert [f.name for f in settings.flavours] == ["c5.large", "r5.xlarge"]
    # the default catalogue is the package's (nothing written): one source, extender/flavours.yaml
    default = _configmap(render(helm), "qos-extender-config")
    assert "flavours" not in (yaml.safe_load(default["extender.yaml"]) or {})


def test_a_flavour_change_rolls_the_pods(helm: str, tmp_path: Path) -> None:
    def checksum(docs: list[dict[str, Any]], name: str) -> str:
        (d,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
        value: str = d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    values = tmp_path / "v.yaml"
    values.write_text(
        yaml.safe_dump({"flavours": [{"name": "x", "cpu": "1", "memory": "1Gi", "price_per_hour": 0.01}]})
    )
    a, b = render(helm), render(helm, extra=["-f", str(values)])
    assert checksum(a, "qos-scheduler") != checksum(b, "qos-scheduler")
    assert checksum(a, "qos-autoscaler") != checksum(b, "qos-autoscaler")


def test_webhook_ca_bundle_replaces_cert_manager_and_pod_cidrs_narrow_admission(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    controller = {"webhook": {"caBundle": "Q0EK"}, "admissionPodCIDRs": ["192.168.0.0/16", "10.0.0.0/8"]}
    values.write_text(yaml.safe_dump({"controller": controller, "certificates": {"mode": "manual"}}))
    docs = render(helm, extra=["-f", str(values)])
    (hook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert "cert-manager.io/inject-ca-from" not in (hook["metadata"].get("annotations") or {})
    assert [w["clientConfig"]["caBundle"] for w in hook["webhooks"]] == ["Q0EK"]
    (pol,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "qos-extender-admission"]
    assert pol["spec"]["ingress"][0]["from"][0]["ipBlock"]["except"] == ["192.168.0.0/16", "10.0.0.0/8"]


def test_certificates_self_renders_no_ca_bundle_and_manual_can_name_cert_manager(helm: str) -> None:
    """Mode self (default) renders the webhook without caBundle or cert-manager annotation: qos-certs injects it,
    and `helm upgrade` (a three-way merge) never takes back a field the chart does not render. Mode manual with
    certManagerCertificate hands the injection to cert-manager's cainjector; manual with neither leaves it empty."""
    (hook,) = [d for d in render(helm) if d["kind"] == "MutatingWebhookConfiguration"]
    assert not (hook["metadata"].get("annotations") or {})
    assert all("caBundle" not in w["clientConfig"] for w in hook["webhooks"])
    values = {"certificates.mode": "manual", "controller.webhook.certManagerCertificate": "kube-qos-system/serving"}
    docs = render(helm, values)
    (hook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert hook["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": "kube-qos-system/serving"}
    assert not [d for d in docs if d["metadata"]["name"].startswith("qos-certs")]


def _mounted_secrets(docs: list[dict[str, Any]]) -> set[str]:
    """namespace/name of every Secret a rendered pod mounts, service-account tokens left out."""
    tokens = {
        f"{d['metadata']['namespace']}/{d['metadata']['name']}"
        for d in docs
        if d["kind"] == "Secret" and d.get("type") == "kubernetes.io/service-account-token"
    }
    out = set()
    for d in docs:
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for v in d["spec"]["template"]["spec"].get("volumes") or []:
            if "secret" in v:
                out.add(f"{d['metadata']['namespace']}/{v['secret']['secretName']}")
    return out - tokens


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"autoscaler.mode": "externalgrpc"},
        {"agent.enabled": "false"},
        {"autoscaler.mode": "off", "controller.enabled": "false"},
        {"scheduler.enabled": "false", "controller.enabled": "false"},
        {"scheduler.enabled": "false", "controller.enabled": "false", "autoscaler.mode": "off"},
    ],
)
def test_certificates_cover_every_mounted_secret(helm: str, values: dict[str, str]) -> None:
    """No Secret by hand: with certificates.mode self, every Secret a rendered pod mounts is one qos-certs keeps
    (an authority or a leaf), and it keeps nothing no pod mounts; the webhook it injects and the agents' trust
    ConfigMap are there exactly when their parts are. The keeper's file is loaded by the keeper's own settings."""
    from extender.certs.settings import CertsConfig
    from extender.settings import load_settings

    docs = render(helm, values)
    cm = _configmap(docs, "qos-certs-config")
    config = load_settings(CertsConfig, yaml.safe_load(cm["certs.yaml"])["certs"], "certs.yaml")
    kept = {f"{a.namespace}/{a.secret}" for a in config.authorities} | {c.key for c in config.certificates}
    mounted = _mounted_secrets(docs)
    # Prometheus mounts the scrape client certificates (its own pods are not ours); the qos CA is signing-only
    prometheus = {"kube-qos-system/qos-extender-metrics-client", "kube-qos-agent/qos-agent-metrics-client"}
    assert mounted <= kept, f"mounted but nobody makes them: {sorted(mounted - kept)}"
    signing_only = {"kube-qos-system/qos-ca", "kube-qos-system/cluster-autoscaler-externalgrpc-client"}
    assert kept - mounted <= prometheus | signing_only
    hooks = {d["metadata"]["name"] for d in docs if d["kind"] == "MutatingWebhookConfiguration"}
    assert {w.name for w in config.webhooks} == hooks
    agents = any(d["kind"] == "DaemonSet" for d in docs)
    assert bool(config.trust_configmaps) == agents
    roles = {(d["metadata"].get("namespace"), d["kind"]) for d in docs if d["metadata"]["name"] == "qos-certs"}
    assert (("kube-qos-agent", "Role") in roles) == agents


def test_leaf_lifetime_comes_from_values(helm: str) -> None:
    from extender.certs.settings import CertsConfig
    from extender.settings import load_settings

    cm = _configmap(render(helm, {"certificates.leafLifetimeHours": "24"}), "qos-certs-config")
    assert load_settings(CertsConfig, yaml.safe_load(cm["certs.yaml"])["certs"], "x").leaf_lifetime_hours == 24.0


def test_images_come_from_values(helm: str) -> None:
    docs = render(helm, {"image.repository": "reg.example/qos", "image.tag": "9.9.9", "schedulerImage.tag": "v1.35.9"})
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet", "Job")
        for c in d["spec"]["template"]["spec"].get("containers", [])
        + d["spec"]["template"]["spec"].get("initContainers", [])
    }
    assert images == {"reg.example/qos:9.9.9", "registry.k8s.io/kube-scheduler:v1.35.9"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"autoscaler.mode": "cloud"}, "autoscaler.mode must be expander, externalgrpc or off"),
        ({"scheduler.enabled": "false"}, "controller.enabled needs scheduler.enabled"),
        ({"controller.enabled": "false", "colocation.enabled": "true"}, "colocation.enabled needs controller.enabled"),
        ({"flavours": "m1.large"}, "flavours must be a list"),
        ({"certificates.mode": "cert-manager"}, "certificates.mode must be self or manual"),
    ],
)
def test_bad_values_fail_with_a_clear_message(helm: str, values: dict[str, str], message: str) -> None:
    out = subprocess.run(
        [helm, "template", "qos", str(CHART), *_sets(values)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]


# ------------------------------------------------------------------------------ uninstall releases the gate


def test_uninstall_hook_runs_ungate_with_exactly_what_it_calls(helm: str) -> None:
    """`helm uninstall` first runs `qos-extender ungate` (pre-delete Job): its identity may list and patch pods
    and delete our webhook configuration, the calls extender/processes/ungate.py makes, and nothing else."""
    from extender.cli import build_parser
    from extender.processes import ungate

    docs = render(helm)
    hooks = {(d["kind"], d["metadata"]["name"]): d for d in docs if HOOK in (d["metadata"].get("annotations") or {})}
    assert set(hooks) == {("ServiceAccount", "qos-ungate"), ("ClusterRole", "qos-ungate"),
                          ("ClusterRoleBinding", "qos-ungate"), ("Job", "qos-ungate")}  # fmt: skip
    for d in hooks.values():
        assert d["metadata"]["annotations"][HOOK] == "pre-delete"
    weight = {k: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, d in hooks.items()}
    assert weight[("Job", "qos-ungate")] > max(w for k, w in weight.items() if k[0] != "Job")  # identity first
    job = hooks[("Job", "qos-ungate")]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.func is ungate.run_ungate_command and args.webhook == ungate.DEFAULT_WEBHOOK and not args.dry_run
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"] == f"ghcr.io/kube-qos-extender/kube-qos-extender:{app_version}"
    (webhook,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert webhook["metadata"]["name"] == ungate.DEFAULT_WEBHOOK  # the one it deletes is the one installed
    rules = {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in hooks[("ClusterRole", "qos-ungate")]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert rules == {
        ("", "pods", "list", ()),
        ("", "pods", "patch", ()),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "delete", (ungate.DEFAULT_WEBHOOK,)),
    }
    source = Path(ungate.__file__).read_text()
    calls = set(re.findall(r"\.(list_\w+|patch_\w+|delete_\w+|create_\w+|read_\w+|replace_\w+)\(", source))
    assert calls == {
        "list_pod_for_all_namespaces",
        "list_namespaced_pod",  # --namespace: covered by the cluster-wide list grant
        "patch_namespaced_pod",
        "delete_mutating_webhook_configuration",
    }
    binding = hooks[("ClusterRoleBinding", "qos-ungate")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qos-ungate", "namespace": "kube-qos-system"}]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "qos-ungate"


def test_no_hook_without_the_controller_or_when_turned_off(helm: str) -> None:
    for values in ({"uninstall.ungate": "false"}, {"controller.enabled": "false"}):
        assert not [d for d in render(helm, values) if HOOK in (d["metadata"].get("annotations") or {})]


def test_critical_priority_quota_covers_exactly_the_classes_our_pods_use(helm: str) -> None:
    """Managed clusters that admit system-*-critical pods outside kube-system only under a matching ResourceQuota
    (issue 31's third silent path): criticalPriorityQuota renders one per namespace whose scope is exactly the
    priority classes of the pods the chart runs there (a workload moved to another class would be refused)."""
    assert not [d for d in render(helm) if d["kind"] == "ResourceQuota"]  # off by default: config/default's objects
    docs = render(helm, {"criticalPriorityQuota.enabled": "true"})
    used: dict[str, set[str]] = {}
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            cls = d["spec"]["template"]["spec"].get("priorityClassName")
            if cls and cls.startswith("system-"):
                used.setdefault(d["metadata"]["namespace"], set()).add(cls)
    quotas = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "ResourceQuota"}
    assert set(quotas) == set(used) == {"kube-qos-system", "kube-qos-agent"}
    for ns, quota in quotas.items():
        (expr,) = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert expr["scopeName"] == "PriorityClass" and expr["operator"] == "In"
        assert set(expr["values"]) == used[ns], ns
        assert int(quota["spec"]["hard"]["pods"]) >= 1000
