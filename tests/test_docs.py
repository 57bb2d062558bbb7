"""A newcomer's references lead somewhere (issue 28): every repository path written in the docs, READMEs, code and
manifests names a file or folder that exists, and the design document and the bibliography are in the repo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Paths in upstream projects that our text cites by name (kubernetes' build script, the extender API's Go types).
UPSTREAM = {"hack/lib/version.sh", "extender/v1/types.go"}
_PATH = re.compile(r"(?<![\w./-])((?:extender|config|hack|tests|e2e|bench|docs|lab)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_every_repository_path_in_text_exists() -> None:
    tracked = _tracked()
    prefixes = set(tracked) | {str(Path(f).parent) for f in tracked}
    texts = [
        f for f in tracked if f.endswith((".md", ".py", ".yaml", ".sh", ".toml")) or f in ("Makefile", "Dockerfile")
    ]
    missing: dict[str, str] = {}
    for f in texts:
        if f.startswith("bench/results/") or not (ROOT / f).is_file():
            continue
        for m in _PATH.finditer((ROOT / f).read_text(errors="ignore")):
            path = m.group(1).rstrip(".")
            if path in UPSTREAM or (ROOT / path).exists():
                continue
            # a name pattern (`bench/results/sim-htas-PATTERN.json`) or a file-name prefix (`tests/test_autoscaler_`)
            if any(p.startswith(path) for p in prefixes) or "PATTERN" in path:
                continue
            missing.setdefault(path, f)
    assert missing == {}, f"paths that lead nowhere (path: where): {missing}"


def test_the_design_and_the_papers_are_in_the_repo() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    for package in ("core", "settings", "kube", "controller", "colocation", "webhook", "autoscaler", "agent"):
        assert f"  {package}/" in design, package
        assert (ROOT / "extender" / package).is_dir(), package
    papers = (ROOT / "docs" / "papers.md").read_text()
    for n in range(5):
        assert f"00{n}" in papers
    readme = (ROOT / "README.md").read_text()
    assert "docs/DESIGN.md" in readme and "docs/papers.md" in readme
