"""The slack publisher's pure parts and its model file (extender/colocation/controller.py,
extender/core/slack.py service_idle / batch_capacity, extender/core/characterise.py classify_services)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from extender.colocation.controller import (
    BATCH_CPU,
    BATCH_MEMORY,
    SlackParams,
    capacity_patch,
    load_model,
    load_or_refit,
    plan,
    refresh_every,
    save_model,
)
from extender.core.characterise import (
    DAY_SECONDS,
    CharacteriseConfig,
    ModelFormatError,
    ServiceProfile,
    WorkloadModel,
    classify_services,
    fit_model,
    model_to_document,
)
from extender.core.model import InvalidInputError, Node, Pod, Resources, WorkloadKind
from extender.core.slack import Amount, batch_capacity, service_idle

H6 = 21_600
GI = 2**30
NAN = float("nan")
CFG = CharacteriseConfig(k=2, seeds=(0,), interval_seconds=H6, observation_seconds=H6)


def _p(cpu: list[float], mem: list[float], observed: float = DAY_SECONDS) -> ServiceProfile:
    return ServiceProfile(np.array(cpu), np.array(mem), observed)


def _model() -> WorkloadModel:
    # two cpu classes (day / night), two memory classes (half / quarter)
    return fit_model(
        CFG,
        {
            "a/day": _p([0.25, 0.5, 0.5, 0.25], [0.5] * 4),
            "a/night": _p([0.75, 0.25, 0.25, 0.75], [0.25] * 4),
        },
        now=0.0,
    )


def test_service_idle_is_eq3_per_resource() -> None:
    m = _model()
    day = m.assignments["a/day"]
    # 06:00-12:00: the day class peaks at 0.5 cpu, memory 0.5 -> half of each request is idle
    got = service_idle(m, day, Resources(2000, 4 * GI), at=H6, horizon_seconds=H6)
    assert got == Amount(1000, 2 * GI)
    with pytest.raises(InvalidInputError, match="no memory class"):
        service_idle(m, {"cpu": 0}, Resources(1, 1), at=0, horizon_seconds=H6)
    with pytest.raises(InvalidInputError, match="does not exist"):
        service_idle(m, {"cpu": 0, "memory": 5}, Resources(1, 1), at=0, horizon_seconds=H6)


def test_classify_keeps_known_classes_and_assigns_new_services_after_p() -> None:
    m = _model()
    profiles = {
        "a/day": _p([9.0] * 4, [9.0] * 4),  # known: keeps its fitted class whatever it did since
        "a/young-night": _p([0.7, 0.3, NAN, NAN], [0.2, 0.3, NAN, NAN], observed=H6),
        "a/too-young": _p([0.7, NAN, NAN, NAN], [0.2, NAN, NAN, NAN], observed=H6 - 1),
        "a/other-shape": ServiceProfile(np.array([0.5] * 96), np.array([0.5] * 96), DAY_SECONDS),
    }
    got = classify_services(m, profiles, CFG.observation_seconds)
    assert got["a/day"] == m.assignments["a/day"]
    assert got["a/young-night"] == m.assignments["a/night"]
    assert "a/too-young" not in got and "a/other-shape" not in got


def test_plan_sums_service_predictions_per_node() -> None:
    m = _model()
    svc = Pod("day", Resources.request(2000, 4 * GI), namespace="a", kind=WorkloadKind.SERVICE)
    unclassified = Pod("new", Resources.request(1000, GI), namespace="a", kind=WorkloadKind.SERVICE)
    batch = Pod("job", Resources.request(500, GI), namespace="a", kind=WorkloadKind.BATCH)
    cap = Resources(4000, 8 * GI, 110)
    nodes = [Node("n1", cap, pods=(svc, unclassified, batch)), Node("n2", cap)]
    got = plan(m, nodes, {"a/day": m.assignments["a/day"], "a/job": m.assignments["a/night"]}, H6, H6)
    # only the classified service lends: 2000 m x (1 - 0.5), 4 Gi x (1 - 0.5); the batch pod never does
    assert got == {"n1": Amount(1000, 2 * GI), "n2": Amount(0, 0)}
    assert batch_capacity(nodes, {"a/day": Amount(-5, -5)}) == {"n1": Amount(0, 0), "n2": Amount(0, 0)}


def test_capacity_patch_sets_both_fields_and_only_what_changed() -> None:
    status = {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "4", BATCH_CPU: "1000", BATCH_MEMORY: "5"}}
    ops = capacity_patch(status, Amount(1000, 2 * GI))
    assert ops == [
        {"op": "add", "path": "/status/capacity/qos.kube-qos-extender.io~1batch-cpu", "value": "1000"},
        {"op": "add", "path": "/status/capacity/qos.kube-qos-extender.io~1batch-memory", "value": str(2 * GI)},
        {"op": "add", "path": "/status/allocatable/qos.kube-qos-extender.io~1batch-memory", "value": str(2 * GI)},
    ]
    published = {"capacity": {BATCH_CPU: "7", BATCH_MEMORY: "8"}, "allocatable": {BATCH_CPU: "7", BATCH_MEMORY: "8"}}
    assert capacity_patch(published, Amount(7, 8)) == []
    assert capacity_patch({}, Amount(1, 2))[0] == {
        "op": "add",
        "path": "/status/capacity",
        "value": {BATCH_CPU: "1", BATCH_MEMORY: "2"},
    }
    with pytest.raises(InvalidInputError, match="negative"):
        capacity_patch(published, Amount(-1, 0))


# ---------------------------------------------------------------------------------------------- the file


def test_model_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state" / "model.json"
    assert load_model(path) is None
    m = _model()
    save_model(path, m)
    back = load_model(path)
    assert back is not None
    assert back.assignments == m.assignments
    assert np.array_equal(back.centres("cpu"), m.centres("cpu"))
    assert [p.name for p in path.parent.iterdir()] == ["model.json"]  # no temp file left behind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"format": "kube-qos-extender/workload-model", "version": 1, "clas', "not JSON"),
        (b"\x00\xff garbage", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"format": "kube-qos-extender/workload-model", "version": 99}', "version 99"),
    ],
)
def test_a_bad_model_file_is_a_clear_error_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.json"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match=message) as info:
        load_model(path)
    assert str(path) in str(info.value)


def test_a_truncated_real_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    save_model(path, _model())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="not JSON"):
        load_model(path)


async def test_load_or_refit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "model.json"
    fits = 0

    async def refit() -> WorkloadModel:
        nonlocal fits
        fits += 1
        return _model()

    m, how = await load_or_refit(path, refit)
    assert (how, fits) == ("fitted", 1)
    m2, how = await load_or_refit(path, refit)  # a restart keeps the model: no refit
    assert (how, fits) == ("loaded", 1)
    assert m2.assignments == m.assignments
    doc = model_to_document(m)
    doc["classes"]["cpu"]["centres"] = [[0.1, 0.2]]  # wrong shape: loads as JSON, refused as a model
    path.write_text(json.dumps(doc))
    _, how = await load_or_refit(path, refit)
    assert (how, fits) == ("refitted", 2)
    [record] = [r for r in caplog.records if r.msg.startswith("workload model unusable")]
    assert record.levelname == "ERROR"
    assert str(path) in record.__dict__["error"] and "intervals" in record.__dict__["error"]
    assert load_model(path) is not None  # the refitted model replaced the bad file


async def test_refresh_every_runs_until_stopped_and_survives_a_failing_step() -> None:
    stop = asyncio.Event()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("transient")
        if calls == 3:
            stop.set()

    await refresh_every(0.001, step, stop)
    assert calls == 3


def test_slack_settings_must_let_a_new_service_be_classified(tmp_path: Path) -> None:
    cfg = CharacteriseConfig(observation_seconds=3600.0)
    assert SlackParams(tmp_path / "m.json", cfg, classify_seconds=3600.0).node_selector is None
    with pytest.raises(InvalidInputError, match="observation time"):
        SlackParams(tmp_path / "m.json", cfg, classify_seconds=600.0)
    with pytest.raises(InvalidInputError, match="step_seconds"):
        SlackParams(tmp_path / "m.json", cfg, step_seconds=0.0)
