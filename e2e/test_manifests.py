"""config/: the kustomize base and the kind overlay render with the real kubectl v1.35 (kustomize built in),
the objects pass the real kube-apiserver's validation (server-side dry run), the KubeSchedulerConfiguration
passes the real kube-scheduler's validation, the alert rules pass promtool, and the deploy-time extender
config, flavours and PriorityClasses agree with the extender's settings.

Marked live: it needs the binaries from hack/build-tools.sh and (for the dry run) the cluster of the e2e run.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from extender.settings.extender import deep_merge, load_config, parse_config

pytestmark = [pytest.mark.live]

ROOT = Path(__file__).resolve().parent.parent
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # prometheus-operator CRDs: not in the test cluster


def _bin(name: str) -> str:
    bin_dir = os.environ.get("QOS_BIN_DIR") or str(
        Path(os.environ.get("QOS_CACHE", Path.home() / ".cache/kube-qos-extender")) / "v1.35.8" / "bin"
    )
    path = Path(bin_dir) / name
    if not path.is_file():
        pytest.fail(f"{path} missing: run hack/build-tools.sh", pytrace=False)
    return str(path)


def _render(overlay: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [_bin("kubectl"), "kustomize", str(ROOT / "config" / overlay)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _configmap(docs: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    (cm,) = [d for d in _by_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith(prefix)]
    data: dict[str, str] = cm["data"]
    return data


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return _render("base")


def test_base_renders_the_promised_objects(base: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in base}
    assert kinds >= {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
        "PriorityClass",
        "ConfigMap",
    }
    (dep,) = _by_kind(base, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}
    assert set(containers) == {"kube-scheduler", "extender"}
    # The extender is a native sidecar gated by /readyz: kube-scheduler starts only after its first full sync.
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "extender" and sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert containers["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.35.8"
    pod_sc = dep["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    for c in containers.values():
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # The kube-system RoleBinding stays in kube-system (a top-level kustomize namespace would move it).
    namespaces = {(d["kind"], d["metadata"]["name"]): d["metadata"].get("namespace") for d in base}
    assert namespaces[("RoleBinding", "qos-scheduler-authentication-reader")] == "kube-system"
    assert all(ns in (None, "kube-system", "kube-qos-system") for ns in namespaces.values())


def test_extender_role_is_least_privilege(base: list[dict[str, Any]]) -> None:
    (role,) = [d for d in _by_kind(base, "ClusterRole") if d["metadata"]["name"] == "qos-extender"]
    allowed = {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert all(v in {"get", "list", "watch", "create", "patch"} for _, _, v in allowed)
    assert not any(res in {"secrets", "*"} or v == "*" for _, res, v in allowed)
    writes = {(g, r) for g, r, v in allowed if v in ("create", "patch")}
    assert writes <= {("", "pods/binding"), ("", "bindings"), ("", "events"), ("events.k8s.io", "events")}


def test_scheduler_config_keeps_the_documented_choices(base: list[dict[str, Any]]) -> None:
    cfg = yaml.safe_load(_configmap(base, "qos-scheduler-config")["kube-scheduler.yaml"])
    assert cfg["leaderElection"]["leaderElect"] is True
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["qos-scheduler"]
    (ext,) = cfg["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["weight"] == 5
    # the sidecar's verbs-only plain listener on the pod's private loopback (server.loopback_verbs_port)
    extender_cfg = yaml.safe_load(_configmap(base, "qos-extender-config")["extender.yaml"])
    assert ext["enableHTTPS"] is False
    assert ext["urlPrefix"] == f"http://127.0.0.1:{extender_cfg['server']['loopback_verbs_port']}"
    assert {ext[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} == {
        "filter",
        "prioritize",
        "preempt",
        "bind",
    }
    # its own kube-scheduler, one profile: every pod is ours, no routing marker (it would block CA's simulation)
    assert "managedResources" not in ext and extender_cfg["scheduling"]["marker_resource"] is None


def test_real_kube_scheduler_accepts_the_configuration(base: list[dict[str, Any]], tmp_path: Path) -> None:
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig or not os.environ.get("EXTENDER_CA"):
        pytest.fail("needs KUBECONFIG and EXTENDER_CA/CLIENT_CERT/CLIENT_KEY (hack/local-up.sh)", pytrace=False)
    cfg = yaml.safe_load(_configmap(base, "qos-scheduler-config")["kube-scheduler.yaml"])
    cfg["clientConnection"]["kubeconfig"] = kubeconfig
    cfg["leaderElection"]["leaderElect"] = False
    cfg["extenders"][0]["tlsConfig"] = {
        "caFile": os.environ["EXTENDER_CA"],
        "certFile": os.environ["EXTENDER_CLIENT_CERT"],
        "keyFile": os.environ["EXTENDER_CLIENT_KEY"],
    }
    src, out = tmp_path / "in.yaml", tmp_path / "out.yaml"
    src.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [_bin("kube-scheduler"), f"--config={src}", f"--write-config-to={out}", "--secure-port=0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
    written = yaml.safe_load(out.read_text())
    assert written["extenders"][0]["weight"] == 5
    # Bad input is refused by the same validation (the check above is not vacuous).
    cfg["extenders"][0]["weight"] = 0
    src.write_text(yaml.safe_dump(cfg))
    bad = subprocess.run(
        [_bin("kube-scheduler"), f"--config={src}", f"--write-config-to={out}.bad", "--secure-port=0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0 and "weight" in bad.stderr


def test_api_server_accepts_every_object(base: list[dict[str, Any]], tmp_path: Path) -> None:
    docs = [d for d in base if d["kind"] not in CRD_KINDS]
    # Namespaced objects can be dry-run only into an existing namespace: create it for real (empty, harmless).
    _apply_for_real(_by_kind(docs, "Namespace"), tmp_path / "ns.yaml")
    _server_dry_run(docs, tmp_path / "base.yaml")


def test_alert_rules_pass_promtool(base: list[dict[str, Any]], tmp_path: Path) -> None:
    (rule,) = _by_kind(base, "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run([_bin("promtool"), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"QosExtenderDown", "QosExtenderNotReady", "QosExtenderSlowVerbs", "QosExtenderErrors"} <= alerts


def test_dashboard_has_the_promised_panels(base: list[dict[str, Any]]) -> None:
    dash = json.loads(_configmap(base, "qos-grafana-dashboard")["kube-qos-extender.json"])
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for want in ("verb latency", "sli", "pending pods by q", "cost per hour", "nodes by flavour", "migrations"):
        assert want in titles, (want, titles)
    assert all(t["expr"] for p in dash["panels"] for t in p["targets"])


def test_deployed_config_differs_only_in_server_marker_and_lease_namespace(base: list[dict[str, Any]]) -> None:
    """The ConfigMap holds the base file as written: only what differs from the defaults, nothing copied."""
    data = _configmap(base, "qos-extender-config")
    assert data == {
        "extender.yaml": (ROOT / "config/base/extender.yaml").read_text(),
        "controller.yaml": (ROOT / "config/base/controller.yaml").read_text(),
    }
    deployed = yaml.safe_load(data["extender.yaml"])
    assert set(deployed) == {"server", "scheduling", "controller"}
    assert deployed["scheduling"] == {"marker_resource": None}  # its kube-scheduler serves qos-scheduler only
    assert deployed["controller"] == {"leader_election": {"lease_namespace": "kube-qos-system"}}  # its Role is there
    tls = deployed["server"]["tls"]
    assert tls["cert_file"] and tls["client_ca_file"], "the deployed extender must require client certificates"
    # The strict loader accepts it (TLS files replaced by stand-ins that exist here).
    stand_in = str(ROOT / "config" / "flavours.yaml")
    deployed["server"]["tls"] = {"cert_file": stand_in, "key_file": stand_in, "client_ca_file": stand_in}
    cfg = parse_config(deployed)
    assert cfg.kubernetes.kubeconfig is None and not cfg.controller.enabled


def test_flavours_and_priority_classes_match_the_extender_config(base: list[dict[str, Any]]) -> None:
    cfg = load_config(None)
    flavours = yaml.safe_load((ROOT / "config" / "flavours.yaml").read_text())["flavours"]
    assert [f.name for f in cfg.flavours] == [f["name"] for f in flavours]
    values = {d["metadata"]["name"]: d["value"] for d in _by_kind(base, "PriorityClass")}
    assert values == {f"qos-{name}": cls.priority for name, cls in cfg.policy.classes.items()}


def test_kind_overlay_renders_without_operator_crds() -> None:
    docs = _render("kind")
    kinds = {d["kind"] for d in docs}
    assert not kinds & CRD_KINDS
    images = {
        c["image"]
        for d in _by_kind(docs, "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"] + d["spec"]["template"]["spec"].get("initContainers", [])
    }
    assert "kube-qos-extender:dev" in images


# ------------------------------------------------------------------------------------------------------------
# The whole product (issue 12): config/agent, config/autoscaler (+ its Components), config/default (base +
# controller + agent + autoscaler beside the user's cluster-autoscaler: the production install), config/local
# (this project's local real cluster: + the kwok provider Component), config/cluster-autoscaler (config/default +
# the cloud-provider Component + cluster-autoscaler 1.35 with --cloud-provider=externalgrpc --expander=grpc
# --enable-provisioning-requests) and hack/deploy-local.sh.
# Source-level checks (configs vs loaders, RBAC vs code) are in tests/test_manifests.py; here: what kustomize
# renders, what the real API server accepts (dry run, Pod Security) and what RBAC really authorizes.

COMPOSITIONS = {  # test-only overlays: an overlay plus one Component (consolidation needs the kwok provider)
    "local+consolidation": ("local", "autoscaler/consolidation"),
}
OVERLAYS = ("agent", "autoscaler", "certs", "default", "local", "kind", "cluster-autoscaler", *COMPOSITIONS)
NAMESPACES = {"kube-qos-system", "kube-qos-agent"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = {
        name: _render(name)
        for name in ("base", "agent", "autoscaler", "certs", "default", "local", "kind", "cluster-autoscaler")
    }
    for name, (base, component) in COMPOSITIONS.items():
        d = tmp_path_factory.mktemp(name.replace("+", "-"))  # kustomize wants relative paths, not absolute
        (d / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(ROOT / "config" / base, d)],
                    "components": [os.path.relpath(ROOT / "config" / component, d)],
                }
            )
        )
        proc = subprocess.run([_bin("kubectl"), "kustomize", str(d)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        out[name] = [x for x in yaml.safe_load_all(proc.stdout) if x]
    return out


def _key(d: dict[str, Any]) -> tuple[str, str | None, str]:
    return (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def _pod_templates(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]


@pytest.mark.parametrize("name", OVERLAYS)
def test_new_kustomizations_render(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    keys = [_key(d) for d in docs]
    assert len(keys) == len(set(keys)), "an object is rendered twice"
    assert {ns for _, ns, _ in keys} <= {None, "kube-system", *NAMESPACES}
    # Every ConfigMap and Secret a pod mounts: ConfigMaps rendered here (with their hash suffix), Secrets
    # among those the kustomizations document.
    cms = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    for w in _pod_templates(docs):
        for v in w["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in v:
                # qos-agent-ca: the agents' CA and the kubelets' serving CA, made by the install like the Secrets
                # made by hack/kind-up.sh for config/kind: kwok's stages (from the kwok module) and the kubelets
                # its Prometheus scrapes (from the cluster's nodes)
                made = {"qos-agent-ca", "qos-kwok-stages", "qos-prometheus-kubelets"}
                assert v["configMap"]["name"] in cms | made, (w["metadata"]["name"], v)
            if "secret" in v:
                assert v["secret"]["secretName"] in {
                    "qos-extender-tls",
                    "qos-agent-issuer-ca",  # the agents' CA key, the issuer's alone (the agents request theirs)
                    "qos-autoscaler-expander-tls",
                    "qos-autoscaler-metrics-tls",
                    "qos-scheduler-token",  # kube-scheduler's own API identity (config/base)
                    "qos-autoscaler-agent-client",
                    "qos-autoscaler-cloud-provider-tls",  # config/cluster-autoscaler
                    "cluster-autoscaler-externalgrpc-client",  # config/cluster-autoscaler
                    "qos-extender-metrics-client",  # config/kind's Prometheus
                }, v


def test_default_is_base_controller_agent_autoscaler_and_certs(rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = {(k, ns, n.rsplit("-", 1)[0] if k == "ConfigMap" else n) for k, ns, n in map(_key, rendered["default"])}
    parts: set[tuple[str, str | None, str]] = set()
    for name in ("base", "agent", "autoscaler", "certs"):
        parts |= {(k, ns, n.rsplit("-", 1)[0] if k == "ConfigMap" else n) for k, ns, n in map(_key, rendered[name])}
    controller = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        for f in (
            "clusterrole.yaml",
            "clusterrolebinding.yaml",
            "mutatingwebhookconfiguration.yaml",
            "networkpolicy.yaml",
        )
        for d in yaml.safe_load_all((ROOT / "config" / "controller" / f).read_text())
        if d
    }
    assert default == parts | controller
    kinds = {(k, n) for k, _, n in map(_key, rendered["default"])}
    assert {
        ("ServiceMonitor", "qos-extender"),
        ("ServiceMonitor", "qos-autoscaler"),
        ("PodMonitor", "qos-agent"),
        ("PrometheusRule", "qos-extender"),
    } <= kinds
    cfg = yaml.safe_load(_configmap(rendered["default"], "qos-extender-config")["controller.yaml"])
    assert cfg == {"controller": {"enabled": True}}


def _load_rendered(tmp_path: Path, data: dict[str, str]) -> dict[str, Path]:
    paths = {}
    for key, text in data.items():
        paths[key] = tmp_path / key
        paths[key].write_text(text)
    return paths


def test_rendered_configmaps_load_with_the_projects_loaders(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    from extender.agent.settings import load_agent_config
    from extender.autoscaler.settings import load_autoscaler_config
    from extender.consolidation.settings import parse_consolidation_config

    agent_cm = _configmap(rendered["default"], "qos-agent-config")
    assert agent_cm == {"agent.yaml": (ROOT / "config/agent/agent.yaml").read_text()}
    agent = load_agent_config(str(_load_rendered(tmp_path, agent_cm)["agent.yaml"]), node_name="n")
    assert agent.backend == "kubelet" and agent.tls.enabled and not agent.test_fault_injection

    for overlay, provider in (("local", "kwok"), ("default", "cluster-autoscaler")):
        data = _configmap(rendered[overlay], "qos-autoscaler-config")
        (tmp_path / overlay).mkdir()
        files = _load_rendered(tmp_path / overlay, data)
        extender = load_config(files["extender.yaml"])
        raw = yaml.safe_load(data["autoscaler.yaml"])
        stand_in = str(ROOT / "config" / "flavours.yaml")
        for key in ("cert_file", "key_file"):  # files inside the pod: stand-ins that exist here
            if raw["autoscaler"].get("cluster_autoscaler", {}).get(key):
                raw["autoscaler"]["cluster_autoscaler"][key] = stand_in
        for key in (
            "cert_file",
            "key_file",
            "client_ca_file",
        ):  # /metrics over HTTPS (Secret qos-autoscaler-metrics-tls)
            if raw["autoscaler"].get("metrics", {}).get(key):
                raw["autoscaler"]["metrics"][key] = stand_in
        files["autoscaler.yaml"].write_text(yaml.safe_dump(raw))
        assert load_autoscaler_config(files["autoscaler.yaml"], extender).provider == provider
        source = "config/autoscaler/kwok/autoscaler.yaml" if provider == "kwok" else "config/autoscaler/autoscaler.yaml"
        assert data["autoscaler.yaml"] == (ROOT / source).read_text()
        assert data["extender.yaml"] == (ROOT / "config/autoscaler/extender.yaml").read_text()

    data = _configmap(rendered["local+consolidation"], "qos-autoscaler-config")
    assert data["consolidation.yaml"] == (ROOT / "config/autoscaler/consolidation/consolidation.yaml").read_text()
    raw = yaml.safe_load(data["consolidation.yaml"])
    raw["consolidation"]["agent"].update(dict.fromkeys(("cert_file", "key_file", "ca_file"), stand_in))
    assert parse_consolidation_config(raw).enabled

    cm = _configmap(rendered["default"], "qos-extender-config")
    ext = deep_merge(yaml.safe_load(cm["extender.yaml"]), yaml.safe_load(cm["controller.yaml"]))
    ext["server"]["tls"] = {"cert_file": stand_in, "key_file": stand_in, "client_ca_file": stand_in}
    assert parse_config(ext).controller.enabled


def _stand_in_pem(d: Path) -> tuple[str, str]:
    """A self-signed certificate and its key (the certificate doubles as a CA bundle): the loader reads the files."""
    crt, key = d / "stand-in.crt", d / "stand-in.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=stand-in"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return str(crt), str(key)


def _volume_of(workload: dict[str, Any], container: str, path: str) -> dict[str, Any]:
    """The volume of ``workload``/``container`` that holds ``path`` (longest mountPath prefix)."""
    spec = workload["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == container]
    hits = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert hits, f"{path} is on no volume of {workload['metadata']['name']}/{container}"
    name = max(hits, key=lambda m: len(m["mountPath"]))["name"]
    volumes: list[dict[str, Any]] = [v for v in spec["volumes"] if v["name"] == name]
    (volume,) = volumes
    return volume


def test_cluster_autoscaler_overlay_configs_load_and_match_the_pods(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """config/cluster-autoscaler = config/default + the cloud-provider Component + CA: the rendered
    qos-autoscaler-config loads with the project's loader (cloud provider on 0.0.0.0:8086), the rendered
    cluster-autoscaler-cloud-config holds the keys CA's externalgrpc provider reads, and both agree with the rendered
    pods, Services and Secrets."""
    from extender.autoscaler.settings import load_autoscaler_config

    docs = rendered["cluster-autoscaler"]

    def bare(d: dict[str, Any]) -> tuple[str, str | None, str]:
        k, ns, n = _key(d)
        return (k, ns, n.rsplit("-", 1)[0] if k == "ConfigMap" else n)

    own = {
        bare(d)
        for f in ("cluster-autoscaler.yaml", "cloud-provider/cloud-provider.yaml")
        for d in yaml.safe_load_all((ROOT / "config" / "cluster-autoscaler" / f).read_text())
        if d
    }
    cloud_config_cm = ("ConfigMap", "kube-qos-system", "cluster-autoscaler-cloud-config")
    expected = set(map(bare, rendered["default"])) | own | {cloud_config_cm}
    assert set(map(bare, docs)) == expected

    # The sidecar's config: the cloud-provider Component's file replaced config/autoscaler's.
    data = _configmap(docs, "qos-autoscaler-config")
    assert data["autoscaler.yaml"] == (ROOT / "config/cluster-autoscaler/cloud-provider/autoscaler.yaml").read_text()
    assert data["extender.yaml"] == (ROOT / "config/autoscaler/extender.yaml").read_text()
    files = _load_rendered(tmp_path, data)
    raw = yaml.safe_load(data["autoscaler.yaml"])
    ca = raw["autoscaler"]["cluster_autoscaler"]
    cloud = ca["cloud_provider"]
    in_pod = {
        **{f"cluster_autoscaler.{k}": ca[k] for k in ("cert_file", "key_file")},
        **{f"cloud_provider.{k}": cloud[k] for k in ("cert_file", "key_file", "client_ca_file")},
    }
    crt, key = _stand_in_pem(tmp_path)  # files inside the pod: stand-ins that exist here (the loader reads them)
    ca.update(cert_file=crt, key_file=key)
    cloud.update(cert_file=crt, key_file=key, client_ca_file=crt)
    if "metrics" in raw["autoscaler"]:
        raw["autoscaler"]["metrics"].update(cert_file=crt, key_file=key, client_ca_file=crt)
    files["autoscaler.yaml"].write_text(yaml.safe_dump(raw))
    settings = load_autoscaler_config(files["autoscaler.yaml"], load_config(files["extender.yaml"]))
    cp = settings.expander.cloud_provider
    assert settings.provider == "cluster-autoscaler" and cp is not None
    assert cp.listen == "0.0.0.0:8086" and cp.backend == "kwok" and settings.expander.listen == "0.0.0.0:7000"

    # ... and the rendered qos-autoscaler pod: the files on the right Secrets, the ports, the Services.
    sidecar = _named(docs, "Deployment", "qos-autoscaler")
    (c,) = sidecar["spec"]["template"]["spec"]["containers"]
    for option, path in in_pod.items():
        secret = "qos-autoscaler-expander-tls" if option.startswith("cluster_") else "qos-autoscaler-cloud-provider-tls"
        assert _volume_of(sidecar, c["name"], path)["secret"]["secretName"] == secret, (option, path)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc-cloud"] == int(cp.listen.rsplit(":", 1)[1])
    assert ports["grpc-expander"] == int(settings.expander.listen.rsplit(":", 1)[1])
    labels = sidecar["spec"]["template"]["metadata"]["labels"]
    service = _named(docs, "Service", "qos-autoscaler-cloud-provider")
    (sp,) = service["spec"]["ports"]
    assert service["spec"]["selector"].items() <= labels.items() and sp["targetPort"] == "grpc-cloud"

    # CA's cloud-config: the Service above, the client certificate files on CA's client Secret.
    cc = _configmap(docs, "cluster-autoscaler-cloud-config")
    assert set(cc) == {"cloud-config.yaml"}
    keys = yaml.safe_load(cc["cloud-config.yaml"])
    assert set(keys) <= {"address", "cert", "key", "cacert", "grpc_timeout"}, keys  # what CA's provider reads
    cloud_config = SimpleNamespace(**keys)
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert cloud_config.address == f"{svc}:{sp['port']}"
    assert cloud_config.cert and cloud_config.key and cloud_config.cacert, "without cert CA dials plaintext"
    ca_dep = _named(docs, "Deployment", "cluster-autoscaler")
    (ca_c,) = ca_dep["spec"]["template"]["spec"]["containers"]
    for path in (cloud_config.cert, cloud_config.key, cloud_config.cacert):
        volume = _volume_of(ca_dep, ca_c["name"], path)
        assert volume["secret"]["secretName"] == "cluster-autoscaler-externalgrpc-client", path
    args = dict(a.split("=", 1) for a in ca_c["args"])
    assert args["--cloud-provider"] == "externalgrpc" and args["--expander"] == "grpc"
    assert args["--enable-provisioning-requests"] == "true"  # gated qos pods reach CA only as our requests
    cm_volume = _volume_of(ca_dep, ca_c["name"], args["--cloud-config"])
    assert cm_volume["configMap"]["name"].startswith("cluster-autoscaler-cloud-config-")
    assert args["--cloud-config"].rsplit("/", 1)[1] == "cloud-config.yaml"
    expander = _named(docs, "Service", "qos-autoscaler-expander")
    (ep,) = expander["spec"]["ports"]
    assert args["--grpc-expander-url"] == f"qos-autoscaler-expander.kube-qos-system.svc:{ep['port']}"
    assert _volume_of(ca_dep, ca_c["name"], args["--grpc-expander-cert"])["secret"]["secretName"] == (
        "qos-autoscaler-expander-tls"
    )


def test_local_overlay_fits_this_machine(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["local"]
    assert not {d["kind"] for d in docs} & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    hook = _named(docs, "MutatingWebhookConfiguration", "qos-extender-ordering")
    assert "cert-manager.io/inject-ca-from" not in (hook["metadata"].get("annotations") or {})
    images = set()
    for w in _pod_templates(docs):
        spec = w["spec"]["template"]["spec"]
        # the only init container is the extender's native sidecar (same image set, nothing else pulled)
        assert all(c.get("restartPolicy") == "Always" for c in spec.get("initContainers", []))
        for c in spec["containers"] + spec.get("initContainers", []):
            images.add(c["image"])
            assert c["imagePullPolicy"] == "Never", (w["metadata"]["name"], c["name"])
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert {"key": "type", "operator": "NotIn", "values": ["kwok"]} in term["matchExpressions"]
    assert images == {"kube-qos-extender:dev", "registry.k8s.io/kube-scheduler:v1.35.8"}
    assert _named(docs, "Deployment", "qos-scheduler")["spec"]["replicas"] == 1
    ds = _named(docs, "DaemonSet", "qos-agent")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert volumes["kubelet-checkpoints"]["hostPath"]["path"] == "/var/lib/qos-local-nodes"
    assert mounts["kubelet-checkpoints"]["subPathExpr"] == "$(NODE_NAME)/kubelet/checkpoints"
    assert mounts["kubelet-checkpoints"]["mountPath"] == "/var/lib/kubelet/checkpoints"
    assert mounts["state"]["subPathExpr"] == "$(NODE_NAME)/qos-agent"
    assert not any("containerd" in v.get("hostPath", {}).get("path", "") for v in volumes.values())
    cfg = yaml.safe_load(_configmap(docs, "qos-autoscaler-config")["autoscaler.yaml"])
    assert cfg["autoscaler"].get("provider", "kwok") == "kwok"  # the lab's file leaves the default, kwok


def _kubectl() -> list[str]:
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.fail("needs KUBECONFIG (hack/local-up.sh)", pytrace=False)
    return [_bin("kubectl"), "--kubeconfig", kubeconfig]


def _server_dry_run(docs: list[dict[str, Any]], path: Path) -> None:
    """Every object accepted by the real apiserver's server-side dry run (warnings allowed, nothing else)."""
    path.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run(
        [*_kubectl(), "apply", "--dry-run=server", "--server-side", "--force-conflicts", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    errors = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    assert proc.returncode == 0 and not errors, proc.stderr[-3000:]
    assert proc.stdout.count("(server dry run)") == len(docs), proc.stdout


def _apply_for_real(docs: list[dict[str, Any]], path: Path) -> None:
    path.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run(
        [
            *_kubectl(),
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=qos-test-manifests",
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["default", "local", "kind", "cluster-autoscaler", *COMPOSITIONS])
def test_api_server_accepts_the_new_objects(
    rendered: dict[str, list[dict[str, Any]]], name: str, tmp_path: Path
) -> None:
    docs = [d for d in rendered[name] if d["kind"] not in CRD_KINDS | {"PodMonitor"}]
    # Objects can be dry-run only into an existing namespace: create the (empty) namespaces for real.
    _apply_for_real([d for d in docs if d["kind"] == "Namespace"], tmp_path / "ns.yaml")
    for d in docs:
        # hack/local-up.sh registers a webhook of the same name with clientConfig.url; a merge with our
        # clientConfig.service is invalid, so validate ours as a new object (hack/deploy-local.sh replaces it).
        if d["kind"] == "MutatingWebhookConfiguration":
            d["metadata"]["name"] += "-dry-run"
    _server_dry_run(docs, tmp_path / "all.yaml")


def test_pod_security_admits_every_pod_where_it_runs(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """The pods of each workload, as Pods, through the real admission chain (Pod Security enforce level of
    their namespace, ServiceAccount, priority), for config/default and config/cluster-autoscaler (which adds
    cluster-autoscaler's pod and ServiceAccount); the agent's pod in the scheduler's namespace is refused, so the
    check is not vacuous."""
    overlays = ("default", "cluster-autoscaler")
    for name in overlays:
        accounts = [d for d in rendered[name] if d["kind"] in ("Namespace", "ServiceAccount")]
        _apply_for_real(accounts, tmp_path / f"sa-{name}.yaml")

    def pod(w: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"dry-run-{w['metadata']['name']}",
                "namespace": namespace or w["metadata"]["namespace"],
                "labels": w["spec"]["template"]["metadata"]["labels"],
            },
            "spec": {**w["spec"]["template"]["spec"], "nodeName": "dry-run-node"},
        }

    def create(p: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        f = tmp_path / f"{p['metadata']['name']}-{p['metadata']['namespace']}.yaml"
        f.write_text(yaml.safe_dump(p))
        return subprocess.run(
            [*_kubectl(), "create", "--dry-run=server", "-f", str(f)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    admitted = set()
    for name in overlays:
        for w in _pod_templates(rendered[name]):
            proc = create(pod(w))
            assert proc.returncode == 0, (name, w["metadata"]["name"], proc.stderr)
            admitted.add((name, w["metadata"]["name"]))
    assert ("cluster-autoscaler", "cluster-autoscaler") in admitted
    agent = _named(rendered["default"], "DaemonSet", "qos-agent")
    moved = pod(agent, "kube-qos-system")
    moved["spec"]["serviceAccountName"] = "qos-scheduler"
    refused = create(moved)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


def _allowed(
    user: str, groups: list[str], verb: str, resource: str, name: str = "", namespace: str = "", group: str = ""
) -> bool:
    res, _, sub = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": groups,
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": res,
                "subresource": sub,
                "name": name,
                "namespace": namespace,
                "version": "v1",
            },
        },
    }
    proc = subprocess.run(
        [*_kubectl(), "create", "-o", "json", "-f", "-"],
        input=json.dumps(review),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return bool(json.loads(proc.stdout)["status"].get("allowed"))


def test_rbac_authorizes_what_the_code_calls_and_nothing_more(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The RBAC objects of config/default, applied for real, asked through SubjectAccessReview exactly what the
    kubelet (for an agent's per-node client certificate) and the API server (for the tokens) ask."""
    docs = rendered["default"]
    kinds = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    rbac = [d for d in docs if d["kind"] in kinds]
    _apply_for_real(rbac, tmp_path / "rbac.yaml")
    autoscaler = ("system:serviceaccount:kube-qos-system:qos-autoscaler", ["system:serviceaccounts"])
    agent_sa = ("system:serviceaccount:kube-qos-agent:qos-agent", ["system:serviceaccounts"])
    issuer = ("system:serviceaccount:kube-qos-agent:qos-agent-issuer", ["system:serviceaccounts"])
    # No static grant lets an agent's kubelet certificate checkpoint: the issuer binds one node each
    # (extender/agent/identity.py node_role; tests/test_agent_identity_live.py asks the authorizer about those).
    agent_user = ("qos-agent:node-a", ["system:authenticated"])
    for verb, resource in (("create", "nodes/checkpoint"), ("create", "nodes/proxy"), ("get", "nodes/proxy")):
        assert not _allowed(*agent_user, verb, resource, name="node-a"), (verb, resource)
    # The agents' ServiceAccount: its CSRs and the pod it is about to checkpoint; nothing else.
    csr = "certificates.k8s.io"
    assert _eventually(lambda: _allowed(*agent_sa, "create", "certificatesigningrequests", group=csr), True)
    assert _allowed(*agent_sa, "get", "pods", namespace="default")
    for verb, resource, group in (("create", "events", ""), ("patch", "pods", ""), ("get", "nodes", ""),
                                  ("list", "pods", ""), ("get", "secrets", ""),
                                  ("update", "certificatesigningrequests/approval", csr)):  # fmt: skip
        assert not _allowed(*agent_sa, verb, resource, namespace="default", group=group), (verb, resource)
    # The issuer: approves for its two signers, signs for ours only, and holds no secrets or pod writes.
    for verb, signer in (("approve", "kube-qos-extender.io/agent"), ("approve", "kubernetes.io/kube-apiserver-client"),
                         ("sign", "kube-qos-extender.io/agent")):  # fmt: skip
        assert _allowed(*issuer, verb, "signers", name=signer, group=csr), (verb, signer)
    for verb, signer in (("sign", "kubernetes.io/kube-apiserver-client"), ("approve", "kubernetes.io/kubelet-serving")):
        assert not _allowed(*issuer, verb, "signers", name=signer, group=csr), (verb, signer)
    assert _allowed(*issuer, "get", "pods", namespace="kube-qos-agent")
    for verb, resource, namespace in (("get", "pods", "default"), ("get", "secrets", "kube-qos-agent"),
                                      ("create", "pods", "kube-qos-agent"), ("create", "nodes/proxy", "")):  # fmt: skip
        assert not _allowed(*issuer, verb, resource, namespace=namespace), (verb, resource, namespace)
    # The autoscaler beside cluster-autoscaler (production): reflectors, Events, the consume annotation on pods,
    # its own ProvisioningRequests and PodTemplates in kube-qos-system. No node writes: CA buys and removes nodes.
    # (Other tests may have bound the lab's qos-autoscaler-kwok / -consolidation roles: unbind them.)
    for binding in ("qos-autoscaler-kwok", "qos-autoscaler-consolidation", "qos-autoscaler-cloud-provider"):
        subprocess.run(
            [*_kubectl(), "delete", "clusterrolebinding", binding, "--ignore-not-found"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
    ns = "kube-qos-system"
    assert _eventually(lambda: _allowed(*autoscaler, "create", "provisioningrequests", namespace=ns, group=PR), True)
    for verb, resource, namespace, group in (
        ("list", "nodes", "", ""),
        ("watch", "nodes", "", ""),
        ("list", "pods", "", ""),
        ("watch", "pods", "", ""),
        ("create", "events", "default", ""),
        ("patch", "pods", "default", ""),
        ("create", "podtemplates", ns, ""),
        ("delete", "podtemplates", ns, ""),
        ("create", "provisioningrequests", ns, PR),
        ("delete", "provisioningrequests", ns, PR),
        ("list", "provisioningrequests", ns, PR),
    ):
        assert _allowed(*autoscaler, verb, resource, namespace=namespace, group=group), (verb, resource)
    # Its Lease (leader election): created in its namespace, then read and written by name only.
    lease = "coordination.k8s.io"
    assert _allowed(*autoscaler, "create", "leases", namespace=ns, group=lease)
    for verb in ("get", "update"):
        assert _allowed(*autoscaler, verb, "leases", name="qos-autoscaler", namespace=ns, group=lease), verb
        assert not _allowed(*autoscaler, verb, "leases", name="qos-extender", namespace=ns, group=lease), verb
    for verb in ("create", "get", "delete"):
        assert not _allowed(*autoscaler, verb, "leases", name="qos-autoscaler", namespace="kube-system", group=lease)
    assert not _allowed(*autoscaler, "delete", "leases", name="qos-autoscaler", namespace=ns, group=lease)
    assert not _eventually(lambda: _allowed(*autoscaler, "create", "nodes"), False)
    for verb, resource, namespace, group in (
        ("delete", "nodes", "", ""),
        ("patch", "nodes", "", ""),
        ("update", "nodes", "", ""),
        ("get", "secrets", ns, ""),
        ("create", "pods", "default", ""),
        ("delete", "pods", "default", ""),
        ("create", "pods/eviction", "default", ""),
        ("patch", "events", "default", ""),
        ("get", "leases", ns, ""),
        ("create", "provisioningrequests", "default", PR),  # its own namespace only
        ("create", "podtemplates", "default", ""),
        ("update", "provisioningrequests/status", ns, PR),  # CA's to write
    ):
        assert not _allowed(*autoscaler, verb, resource, namespace=namespace, group=group), (verb, resource)


PR = "autoscaling.x-k8s.io"


def _eventually(check: Any, want: bool, timeout: float = 10.0) -> bool:
    """The authorizer's RBAC caches follow deletes and applies through informers: wait for ``want``."""
    deadline = time.monotonic() + timeout
    while (got := bool(check())) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def test_cluster_autoscaler_rbac_authorizes_the_cloud_provider_writes(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """config/cluster-autoscaler's RBAC, applied for real: qos-autoscaler creates and deletes the kwok Nodes CA buys
    through ClusterRole qos-autoscaler-cloud-provider (qos-autoscaler-kwok is not in this overlay) and gets nothing of
    cluster-autoscaler's own roles; those go to CA's ServiceAccount, ProvisioningRequests included."""
    docs = rendered["cluster-autoscaler"]
    autoscaler_sa = {"kind": "ServiceAccount", "name": "qos-autoscaler", "namespace": "kube-qos-system"}
    bound = {d["roleRef"]["name"] for d in docs if d["kind"].endswith("Binding") and autoscaler_sa in d["subjects"]}
    assert bound == {
        "qos-autoscaler",
        "qos-autoscaler-demand",
        "qos-autoscaler-cloud-provider",
        "qos-autoscaler-leader",
    }
    for binding in ("qos-autoscaler-kwok", "qos-autoscaler-consolidation"):
        subprocess.run(
            [*_kubectl(), "delete", "clusterrolebinding", binding, "--ignore-not-found"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
    kinds = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    rbac = [d for d in docs if d["kind"] in kinds]
    _apply_for_real(rbac, tmp_path / "rbac.yaml")
    autoscaler = ("system:serviceaccount:kube-qos-system:qos-autoscaler", ["system:serviceaccounts"])
    ca = ("system:serviceaccount:kube-qos-system:cluster-autoscaler", ["system:serviceaccounts"])
    ns = "kube-qos-system"
    assert _eventually(lambda: _allowed(*autoscaler, "create", "nodes"), True)
    for verb, resource, namespace in (
        ("delete", "nodes", ""),
        ("list", "nodes", ""),
        ("watch", "pods", ""),
        ("create", "events", "default"),
    ):
        assert _allowed(*autoscaler, verb, resource, namespace=namespace), (verb, resource)
    # What cluster-autoscaler itself needs (its own roles) is not the sidecar's.
    ca_only = (
        ("", "update", "nodes", "", ""),
        ("", "create", "pods/eviction", "default", ""),
        ("", "get", "configmaps", ns, "cluster-autoscaler-status"),
        ("coordination.k8s.io", "update", "leases", ns, "cluster-autoscaler"),
        ("policy", "list", "poddisruptionbudgets", "default", ""),
        ("autoscaling.x-k8s.io", "watch", "provisioningrequests", "default", ""),
        ("autoscaling.x-k8s.io", "patch", "provisioningrequests/status", ns, ""),
        ("", "list", "podtemplates", "default", ""),
    )
    for group, verb, resource, namespace, name in ca_only:
        assert not _allowed(*autoscaler, verb, resource, name=name, namespace=namespace, group=group), resource
        assert _allowed(*ca, verb, resource, name=name, namespace=namespace, group=group), (verb, resource)
    # patch nodes came only from qos-autoscaler-kwok (the dry-run loop under CA retires nothing): wait for the
    # authorizer to drop the deleted binding
    assert not _eventually(lambda: _allowed(*autoscaler, "patch", "nodes"), False)
    for verb, resource in (("get", "secrets"), ("delete", "pods")):
        assert not _allowed(*autoscaler, verb, resource, namespace=ns), (verb, resource)
    assert not _allowed(*ca, "get", "secrets", namespace=ns)
    # Not vacuous: without the cloud-provider binding the sidecar may not create Nodes.
    subprocess.run(
        [*_kubectl(), "delete", "clusterrolebinding", "qos-autoscaler-cloud-provider"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    try:
        assert not _eventually(lambda: _allowed(*autoscaler, "create", "nodes"), False)
    finally:
        _apply_for_real(rbac, tmp_path / "rbac.yaml")


def test_deploy_local_dry_run(tmp_path: Path) -> None:
    """hack/deploy-local.sh end to end against the live cluster, every object sent with --dry-run=server."""
    kubeconfig = _kubectl()[2]
    state = os.environ.get("QOS_STATE")
    if not state or not (Path(state) / "certs" / "ca.key").is_file():
        pytest.fail("needs QOS_STATE with the local CA (hack/local-up.sh prints it)", pytrace=False)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "QOS_STATE": state, "QOS_BIN_DIR": str(Path(_bin("kubectl")).parent)}
    proc = subprocess.run(
        [str(ROOT / "hack" / "deploy-local.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert values["QOS_DEPLOY_DRY_RUN"] == "1"
    assert (values["QOS_NAMESPACE"], values["QOS_AGENT_NAMESPACE"]) == ("kube-qos-system", "kube-qos-agent")
    assert values["QOS_AGENT_DAEMONSET"] == "qos-agent" and values["QOS_AUTOSCALER_DEPLOYMENT"] == "qos-autoscaler"
    for key in ("AGENT_CA", "AGENT_CLIENT_CERT", "AGENT_CLIENT_KEY", "EXTENDER_CLIENT_CERT"):
        assert Path(values[key]).is_file(), key
    errors = [
        line
        for line in proc.stderr.splitlines()
        if ("error" in line.lower() and not line.startswith(("Warning:", "["))) or line.startswith("ERROR")
    ]
    assert not errors, proc.stderr[-3000:]
    for secret in ("qos-extender-tls", "qos-agent-issuer-ca", "qos-agent-metrics-client", "qos-autoscaler-agent-client",
                   "qos-autoscaler-metrics-tls"):  # fmt: skip
        assert f"secret/{secret} serverside-applied (server dry run)" in proc.stderr
    assert "configmap/qos-agent-ca serverside-applied (server dry run)" in proc.stderr
    for obj in ("daemonset.apps/qos-agent", "deployment.apps/qos-autoscaler", "deployment.apps/qos-scheduler",
                "deployment.apps/qos-agent-issuer"):  # fmt: skip
        assert f"{obj} serverside-applied (server dry run)" in proc.stderr
    # The callers' certificates on the agents' own CA (not the cluster's): the agents' own are not made here,
    # each agent asks for its node's (CSR API) and qos-agent-issuer signs it.
    certs = Path(values["QOS_DEPLOY_CERTS"])
    for name in ("agent-metrics-client", "autoscaler-agent-client"):
        crt = str(certs / f"{name}.crt")
        verify = ["openssl", "verify", "-CAfile"]
        assert subprocess.run([*verify, values["AGENT_CA"], crt], check=False, capture_output=True).returncode == 0
        assert subprocess.run([*verify, f"{state}/certs/ca.crt", crt], check=False, capture_output=True).returncode != 0
