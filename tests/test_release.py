"""One version per release (issue 31): the package (pyproject.toml, extender.__version__), the image tag every
config/ part deploys, the Helm chart's version and appVersion, and the newest CHANGELOG.md entry are the same
string; the kube-scheduler the chart and config/ ship is the one hack/versions.env builds and tests with, and the
README's compatibility table names it. A release bumps them together, or this fails."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

import extender

ROOT = Path(__file__).resolve().parent.parent
SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")


def _version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert SEMVER.match(version), f"pyproject version {version!r} is not semver (Helm needs one)"
    return version


def _images(kustomization: Path) -> dict[str, str]:
    doc = yaml.safe_load(kustomization.read_text())
    return {i["name"]: str(i["newTag"]) for i in doc.get("images") or []}


def test_package_chart_image_and_changelog_carry_one_version() -> None:
    version = _version()
    assert extender.__version__ == version
    chart = yaml.safe_load((ROOT / "charts/kube-qos-extender/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    values = yaml.safe_load((ROOT / "charts/kube-qos-extender/values.yaml").read_text())
    assert values["image"]["tag"] in ("", version)  # empty: the chart's appVersion
    for part in ("base", "agent", "autoscaler"):
        assert _images(ROOT / "config" / part / "kustomization.yaml")["kube-qos-extender"] == version, part
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+[^\]]*)\]", changelog, flags=re.M)
    assert releases and releases[0] == version, f"newest CHANGELOG.md release {releases[:1]} != {version}"


def test_the_shipped_kube_scheduler_is_the_tested_one_and_the_readme_says_so() -> None:
    env = dict(
        line.split("=", 1)
        for line in (ROOT / "hack/versions.env").read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    )
    kube = env["KUBE_VERSION"]
    assert _images(ROOT / "config/base/kustomization.yaml")["kube-scheduler"] == kube
    values = yaml.safe_load((ROOT / "charts/kube-qos-extender/values.yaml").read_text())
    assert values["schedulerImage"]["tag"] == kube
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Compatibility", 1)[1].split("\n## ", 1)[0]
    assert f"| {_version()} | {kube} |" in section, "README's compatibility table lacks this release's row"
