"""config/: the kustomize base and the kind overlay render with the real kubectl v1.35 (kustomize built in),
the objects pass the real kube-apiserver's validation (server-side dry run), the KubeSchedulerConfiguration
passes the real kube-scheduler's validation, the alert rules pass promtool, and the deploy-time extender
config, flavours and PriorityClasses agree with config/extender.yaml.

Marked live: it needs the binaries from hack/build-tools.sh and (for the dry run) the cluster of the e2e run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.config import load_config, parse_config

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
    containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"kube-scheduler", "extender"}
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
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is True and ext["weight"] == 5
    assert {ext[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} == {
        "filter",
        "prioritize",
        "preempt",
        "bind",
    }
    assert ext["managedResources"] == [{"name": "qos.kube-qos-extender.io/managed", "ignoredByScheduler": True}]


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
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        pytest.fail("needs KUBECONFIG (hack/local-up.sh)", pytrace=False)
    docs = [d for d in base if d["kind"] not in CRD_KINDS]
    kubectl = [_bin("kubectl"), "--kubeconfig", kubeconfig]
    # Namespaced objects can be dry-run only into an existing namespace: create it for real (empty, harmless).
    (ns,) = _by_kind(docs, "Namespace")
    ns_file = tmp_path / "ns.yaml"
    ns_file.write_text(yaml.safe_dump(ns))
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(ns_file)], capture_output=True, check=True, timeout=60
    )
    manifest = tmp_path / "base.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run(
        [*kubectl, "apply", "--dry-run=server", "--server-side", "--force-conflicts", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    errors = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    assert proc.returncode == 0 and not errors, proc.stderr[-3000:]
    assert proc.stdout.count("(server dry run)") == len(docs), proc.stdout


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


def test_deployed_config_differs_in_server_kubeconfig_and_lease_namespace(base: list[dict[str, Any]]) -> None:
    deployed = yaml.safe_load(_configmap(base, "qos-extender-config")["extender.yaml"])
    shipped = yaml.safe_load((ROOT / "config" / "extender.yaml").read_text())
    assert deployed["kubernetes"]["kubeconfig"] is None
    for key in set(shipped) | set(deployed):
        if key == "server":
            continue
        if key == "kubernetes":
            assert {**deployed[key], "kubeconfig": None} == {**shipped[key], "kubeconfig": None}
            continue
        if key == "controller":  # the Lease lives in the deployment's own namespace (its Role is there)
            assert deployed[key]["leader_election"]["lease_namespace"] == "kube-qos-system"
            ours = {**deployed[key], "leader_election": {**deployed[key]["leader_election"], "lease_namespace": None}}
            theirs = {**shipped[key], "leader_election": {**shipped[key]["leader_election"], "lease_namespace": None}}
            assert ours == theirs
            continue
        assert deployed.get(key) == shipped.get(key), key
    tls = deployed["server"]["tls"]
    assert tls["cert_file"] and tls["client_ca_file"], "the deployed extender must require client certificates"
    # The strict loader accepts it (TLS files replaced by stand-ins that exist here).
    stand_in = str(ROOT / "config" / "extender.yaml")
    deployed["server"]["tls"] = {"cert_file": stand_in, "key_file": stand_in, "client_ca_file": stand_in}
    parse_config(deployed)


def test_flavours_and_priority_classes_match_the_extender_config(base: list[dict[str, Any]]) -> None:
    cfg = load_config(None)
    flavours = yaml.safe_load((ROOT / "config" / "flavours.yaml").read_text())["flavours"]
    shipped = yaml.safe_load((ROOT / "config" / "extender.yaml").read_text())["flavours"]
    assert flavours == shipped
    values = {d["metadata"]["name"]: d["value"] for d in _by_kind(base, "PriorityClass")}
    assert values == {f"qos-{name}": cls.priority for name, cls in cfg.policy.classes.items()}


def test_kind_overlay_renders_without_operator_crds() -> None:
    docs = _render("kind")
    kinds = {d["kind"] for d in docs}
    assert not kinds & CRD_KINDS
    images = {c["image"] for d in _by_kind(docs, "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
    assert "kube-qos-extender:dev" in images
