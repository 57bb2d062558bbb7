"""hack/README.md describes what hack/local-up.sh really does: the printed KEY=VALUE lines name the files the
script prints, and every client certificate the README ties to a subject CN is generated with that CN.

The README is what engineers read to wire a scraper or a scheduler by hand; a stale line there (one
certificate "used by the scheduler and by Prometheus" after the identities were split) sends a scrape with the
verbs-only identity, which the extender refuses with 403.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "hack" / "README.md").read_text()
LOCAL_UP = (ROOT / "hack" / "local-up.sh").read_text()


def _printed_by_script() -> dict[str, str]:
    """KEY -> file name of the cert/key lines local-up.sh echoes into its env."""
    return dict(re.findall(r'echo "([A-Z_]+)=\$\{CERTS\}/([\w.-]+)"', LOCAL_UP))


def _printed_in_readme() -> dict[str, str]:
    (block,) = re.findall(r"Printed \(stdout.*?```\n(.*?)```", README, re.S)
    return {k: Path(v).name for k, v in re.findall(r"^([A-Z_]+)=(\S+)$", block, re.M) if "/certs/" in v}


def test_readme_printed_lines_name_the_files_local_up_prints() -> None:
    script, readme = _printed_by_script(), _printed_in_readme()
    assert script, "no cert lines found in local-up.sh: the pattern is stale"
    assert readme == script


def test_readme_cert_subjects_match_local_up() -> None:
    generated = dict(re.findall(r'gen_cert ([\w-]+) "/O=[^/"]*/CN=([\w-]+)"', LOCAL_UP))
    assert {"extender-client", "extender-metrics-client"} <= set(generated)
    claims = re.findall(r"`([\w-]+)` \(CN=([\w-]+)", README)
    assert claims, "the README names no client certificate with its CN"
    for name, cn in claims:
        assert generated.get(name) == cn, (name, cn, generated.get(name))
