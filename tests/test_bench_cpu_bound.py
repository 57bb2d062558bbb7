"""bench/e2e_throughput.py's CPU-bound ratio: the ratio a saturated host allows, from each phase's CPU per pod."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.e2e_throughput import cpu_bound_ratio

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def _phase(profile: str, cpu_ms: dict[str, float], seconds: float, pods: int = 1000) -> dict[str, object]:
    return {
        "profile": profile,
        "bind_seconds": seconds,
        "cpu_ms_per_pod_while_binding": cpu_ms,
        "cpu_seconds_while_binding": {c: v * pods / 1000 for c, v in cpu_ms.items()},
    }


def test_the_ratio_is_default_cpu_per_pod_over_qos_summed_over_components_and_averaged_over_rounds() -> None:
    phases = [
        _phase("default", {"kube-apiserver": 4.0, "kube-scheduler": 2.0}, 3.0),
        _phase("qos", {"kube-apiserver": 4.0, "kube-scheduler": 1.5, "qos-extender": 2.5}, 4.0),
        _phase("default", {"kube-apiserver": 5.0, "kube-scheduler": 1.0}, 3.0),
        _phase("qos", {"kube-apiserver": 5.0, "kube-scheduler": 1.0, "qos-extender": 4.0}, 5.0),
    ]
    got = cpu_bound_ratio(phases)
    assert got is not None
    assert got["default_cpu_ms_per_pod"] == pytest.approx(6.0)
    assert got["qos_cpu_ms_per_pod"] == pytest.approx(9.0)
    assert got["ratio"] == pytest.approx(6.0 / 9.0)
    assert got["cores_busy"] == pytest.approx([2.0, 2.0, 2.0, 2.0])


def test_the_null_extenders_phases_are_measured_against_default_when_asked() -> None:
    """bench --null runs default and null phases (no qos): the ratio is then the null extender's."""
    phases = [
        _phase("default", {"kube-apiserver": 4.0, "kube-scheduler": 2.0}, 3.0),
        _phase("null", {"kube-apiserver": 4.0, "kube-scheduler": 2.5, "null-extender": 1.5}, 4.0),
    ]
    assert cpu_bound_ratio(phases) is None
    got = cpu_bound_ratio(phases, "null")
    assert got is not None
    assert got["null_cpu_ms_per_pod"] == pytest.approx(8.0)
    assert got["ratio"] == pytest.approx(6.0 / 8.0)


def test_no_ratio_without_both_profiles() -> None:
    assert cpu_bound_ratio([_phase("default", {"a": 1.0}, 1.0)]) is None
    assert cpu_bound_ratio([]) is None


def test_it_predicts_the_recorded_500_node_runs_whose_cores_were_all_busy() -> None:
    """The finding of issue 34 on a 2-core host, on the recorded runs: where every phase kept both cores busy,
    the CPU-bound ratio is the measured one within 0.04."""
    runs = sorted(RESULTS.glob("e2e-500x2000-issue34-*.json"))
    assert len(runs) >= 3
    for path in runs:
        doc = json.loads(path.read_text())
        got = cpu_bound_ratio(doc["phases"], "null" if doc.get("null_extender") else "qos")
        assert got is not None, path.name
        assert min(got["cores_busy"]) > 1.9, (path.name, got["cores_busy"])
        assert abs(got["ratio"] - doc["ratio"]) <= 0.04, (path.name, got["ratio"], doc["ratio"])
