"""Shared by every test that needs a real cluster (marker ``live``): where its kubeconfig is.

A live test without a cluster FAILS with this message instead of skipping: a skipped live test would let CI
go green without ever talking to a real kube-apiserver.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def require_kubeconfig() -> str:
    """The first file of $KUBECONFIG, or fail the test saying how to get a cluster."""
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if not path or not Path(path).is_file():
        pytest.fail(
            "live tests need a real kube-apiserver: set KUBECONFIG to its kubeconfig "
            '(e.g. `set -a; eval "$(hack/local-up.sh)"; set +a`, or run hack/run-live-tests.sh). '
            f"KUBECONFIG is {os.environ.get('KUBECONFIG') or 'unset'}.",
            pytrace=False,
        )
    return path
