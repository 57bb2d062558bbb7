"""`qos-extender simulate` writes exactly the report schema issue #3 promises, and fails clearly on bad input."""

from pathlib import Path

import orjson
import pytest

from extender.cli import main

RUN_KEYS = {
    "policy", "classes", "penalty", "cost_usd", "fluid_lower_bound_usd", "node_seconds", "preemptions",
    "evictions", "migrations", "lost_work_seconds", "mean_utilization", "wall_seconds",
}  # fmt: skip
CLASS_KEYS = {
    "requests", "availability_mean", "availability_min", "availability_p10", "availability_median",
    "slo_fulfillment", "gini",
}  # fmt: skip


def test_simulate_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    plots = tmp_path / "plots"
    rc = main(
        ["simulate", "--workload", "rodriguez-bursty", "--policy", "htas", "--policy", "k8s", "--json", str(out),
         "--plots", str(plots)]
    )  # fmt: skip
    assert rc == 0
    report = orjson.loads(out.read_bytes())
    assert report["workload"] == "rodriguez-bursty"
    assert [r["policy"] for r in report["runs"]] == ["htas", "k8s"]
    saving = report["comparisons"]["vs_k8s"]["htas"]["saving"]
    assert saving == pytest.approx(1 - report["runs"][0]["cost_usd"] / report["runs"][1]["cost_usd"])
    assert set(report["comparisons"]["vs_k8s"]["htas"]["slo_fulfillment_at_least_k8s"]) == {"bronze", "silver"}
    for run in report["runs"]:
        assert set(run) >= RUN_KEYS
        assert set(run["mean_utilization"]) == {"cpu", "memory"}
        assert run["classes"], "no class stats"
        for stats in run["classes"].values():
            assert set(stats) >= CLASS_KEYS
            assert 0.0 <= stats["availability_min"] <= stats["availability_median"] <= 1.0
        assert 0 < run["fluid_lower_bound_usd"] <= run["cost_usd"]
    assert {p.name for p in plots.iterdir()} == {
        "availability_cdf.png", "cost_rate.png", "nodes_by_flavour.png", "summary.png"
    }  # fmt: skip
    assert all(p.stat().st_size > 10_000 for p in plots.iterdir())
    table = capsys.readouterr().out
    assert "htas" in table and "k8s" in table


def test_simulate_bad_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "no-such-workload"]) == 2
    assert "neither a built-in workload" in capsys.readouterr().err
    assert main(["simulate", "--workload", "rodriguez-slow", "--policy", "magic"]) == 2
    assert "unknown policy 'magic'" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1,1,any,0,1,7200,-1,0.375,0.375,free,0.5\n0,2,2,any,0,1,oops,-1,0.375,0.375,free,0.5\n")
    hosts = tmp_path / "h.txt"
    hosts.write_text('{1,"Host_1",3.75,3.75,[]}.\n')
    assert main(["simulate", "--workload", str(bad), "--hosts", str(hosts)]) == 2
    assert "bad.csv:2" in capsys.readouterr().err


def test_plots_without_matplotlib_is_a_clear_error_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image and a plain install have no matplotlib (the `plots` extra): --plots must say so, not crash."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    rc = main(["simulate", "--workload", "rodriguez-bursty", "--policy", "htas", "--plots", str(tmp_path / "p")])
    captured = capsys.readouterr()
    assert rc == 2
    assert "kube-qos-extender[plots]" in captured.err
    assert captured.out == ""  # nothing was simulated
    assert not (tmp_path / "p").exists()


REPO = Path(__file__).resolve().parent.parent


def test_product_policy_defaults_are_the_shipped_config() -> None:
    """`product` is exactly config/'s product: its compiled-in defaults equal what the processes' own parsers
    read from config/controller, config/autoscaler and its consolidation Component. A changed default in
    config/ without the simulator (or the reverse) fails here."""
    from extender.cli import load_product_settings
    from extender.sim.product import ProductSettings
    from extender.sim.workloads import HTAS_FLAVOURS

    from_files = load_product_settings(REPO / "config")
    assert from_files == ProductSettings()
    assert from_files.host_score == "profile" and from_files.consolidation  # the controller on, consolidation on
    # the flavour catalogue of the built-in autoscaled workloads is the shipped one
    from extender.settings.extender import ExtenderConfig

    assert ExtenderConfig().flavours == HTAS_FLAVOURS


def test_product_config_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["simulate", "--workload", "htas-stable", "--policy", "product", "--product-config", str(tmp_path)]) == 2
    )
    assert "--product-config: cannot read" in capsys.readouterr().err
    (tmp_path / "controller").mkdir()
    (tmp_path / "base").mkdir()
    (tmp_path / "autoscaler" / "consolidation").mkdir(parents=True)
    (tmp_path / "base" / "extender.yaml").write_text("{}\n")
    (tmp_path / "controller" / "controller.yaml").write_text("qos: {alpha_seconds: -1}\n")
    (tmp_path / "autoscaler" / "autoscaler.yaml").write_text("autoscaler: {}\n")
    (tmp_path / "autoscaler" / "consolidation" / "consolidation.yaml").write_text("consolidation: {}\n")
    assert (
        main(["simulate", "--workload", "htas-stable", "--policy", "product", "--product-config", str(tmp_path)]) == 2
    )
    assert "alpha_seconds" in capsys.readouterr().err


def test_demo_simulator_part_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`make demo`'s last part (the simulator's comparison of the whole product with k8s) runs to the end: it built
    its own argparse Namespace and died on a missing option after the cluster part had run (issue 31)."""
    from lab.demo import main as demo

    assert demo(["--simulate-only"]) == 0
    out = capsys.readouterr().out
    assert "product vs k8s: cost" in out
