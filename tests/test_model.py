"""Quantity parsing and the model's refusal of inputs no policy can decide on."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.core.model import (
    Flavour,
    InvalidInputError,
    Node,
    Pod,
    QuantityError,
    Resources,
    ServiceClass,
    WorkloadKind,
    cpu_millicores,
    memory_bytes,
)


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("500m", 500),
        ("2", 2000),
        ("0.1", 100),
        ("1.5", 1500),
        ("100u", 1),
        ("1k", 1_000_000),
        ("2e-3", 2),
        (3, 3000),
    ],
)
def test_cpu_quantities(text: str | int, milli: int) -> None:
    assert cpu_millicores(text) == milli


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1.5Gi", 1610612736),
        ("128974848", 128974848),
        ("129e6", 129_000_000),
        ("129M", 129_000_000),
        ("123Mi", 128974848),
        ("1Ki", 1024),
        ("0.5Ki", 512),
        ("1E", 10**18),
        ("1Ei", 2**60),
        ("1m", 1),  # 0.001 byte rounds up, as Quantity.Value() does
    ],
)
def test_memory_quantities(text: str, nbytes: int) -> None:
    assert memory_bytes(text) == nbytes


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "5xx", "1Gb", "--1", "1 Gi", "Gi", "1e", "nan", "inf"])
def test_malformed_quantity_is_a_clear_error(bad: str) -> None:
    with pytest.raises(QuantityError, match="malformed quantity"):
        cpu_millicores(bad)


@pytest.mark.parametrize("bad", ["-1", "-500m", -2])
def test_negative_quantity_refused(bad: str | int) -> None:
    with pytest.raises(QuantityError, match="negative"):
        cpu_millicores(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, None, [1]])
def test_non_numbers_refused(bad: object) -> None:
    with pytest.raises(QuantityError):
        memory_bytes(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=10**12))
def test_integer_strings_roundtrip(n: int) -> None:
    assert memory_bytes(str(n)) == n
    assert cpu_millicores(f"{n}m") == n


@given(st.integers(0, 10**6), st.integers(0, 10**6 - 1))
def test_binary_suffix_exact(whole: int, frac: int) -> None:
    # "<whole>.<frac>Mi" parsed exactly: no float drift for any representable value
    text = f"{whole}.{frac:06d}Mi"
    exact = (whole * 10**6 + frac) * 2**20
    assert memory_bytes(text) == -(-exact // 10**6)


def test_resources_arithmetic_and_fit() -> None:
    a = Resources(1000, 2048, 1, (("nvidia.com/gpu", 1),))
    b = Resources(500, 1024, 1)
    assert (a + b).cpu_milli == 1500 and (a + b).ext("nvidia.com/gpu") == 1
    assert (a - a) == Resources()
    assert b.fits_in(a) and not a.fits_in(b)
    assert a.shortfall(b) == ["cpu", "memory", "nvidia.com/gpu"]


@pytest.mark.parametrize("kw", [{"cpu_milli": -1}, {"memory_bytes": -5}, {"pods": -1}, {"cpu_milli": 1.5}])
def test_negative_or_fractional_request_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError):
        Resources.request(**kw)  # type: ignore[arg-type]


def test_bad_classes_flavours_pods_nodes() -> None:
    with pytest.raises(InvalidInputError, match="slo"):
        ServiceClass("x", math.nan, 1)
    with pytest.raises(InvalidInputError, match="slo"):
        ServiceClass("x", 1.5, 1)
    with pytest.raises(InvalidInputError, match="importance"):
        ServiceClass("x", 0.9, 0)
    with pytest.raises(InvalidInputError, match="price"):
        Flavour("free", Resources(1000, 1 << 30, 110), 0.0)
    with pytest.raises(InvalidInputError, match="positive"):
        Flavour("empty", Resources(0, 1 << 30, 110), 1.0)
    with pytest.raises(InvalidInputError, match="runtime"):
        Pod("p", Resources.request(1, 1), runtime_seconds=math.nan)
    with pytest.raises(InvalidInputError, match="negative"):
        Node("n", Resources(-1, 0, 0))


def test_remaining_runtime_and_utilization() -> None:
    pod = Pod("b", Resources.request(500, 1 << 30), kind=WorkloadKind.BATCH, runtime_seconds=600, started_at=100.0)
    assert pod.remaining_runtime(400.0) == 300.0
    assert pod.remaining_runtime(1000.0) == 0.0
    svc = Pod("s", Resources.request(500, 1 << 30))
    assert svc.remaining_runtime(10.0) == 0.0
    node = Node("n", Resources(2000, 4 << 30, 110), pods=(pod, svc))
    assert node.utilization() == pytest.approx(0.5)
    assert node.remaining_runtime(400.0) == 300.0
    assert node.free == Resources(1000, 2 << 30, 108)


@given(
    name=st.text(min_size=1, max_size=8),
    namespace=st.text(min_size=1, max_size=8),
    cpu=st.integers(0, 64_000),
    runtime=st.none() | st.floats(0, 1e6),
    started=st.none() | st.floats(-1e6, 1e6),
    progress=st.floats(0, 1e6),
    kind=st.sampled_from(list(WorkloadKind)),
    migratable=st.booleans(),
    now=st.floats(-1e9, 1e9),
)
def test_bound_to_is_the_pod_init_would_build(
    name: str,
    namespace: str,
    cpu: int,
    runtime: float | None,
    started: float | None,
    progress: float,
    kind: WorkloadKind,
    migratable: bool,
    now: float,
) -> None:
    """bound_to copies field by field for speed: every field (one added later included) must come across."""
    import dataclasses

    pod = Pod(
        name, Resources.request(cpu, 1 << 20), "rs-1", namespace, "uid-1", 7, "gold", kind, runtime, started,
        progress, None, migratable,
    )  # fmt: skip
    bound = pod.bound_to("node-a", now)
    expected = dataclasses.replace(pod, started_at=now, node_name="node-a")
    for f in dataclasses.fields(Pod):
        assert getattr(bound, f.name) == getattr(expected, f.name), f.name
    assert bound == expected and bound.key == f"{namespace}/{name}" and pod.node_name is None


def test_bound_to_refuses_a_start_time_init_would_refuse() -> None:
    pod = Pod("p", Resources.request(1, 1))
    for bad in (math.nan, math.inf):
        with pytest.raises(InvalidInputError, match="start time"):
            pod.bound_to("n", bad)


@given(
    pods=st.lists(
        st.tuples(
            st.none() | st.floats(0, 1e5),  # runtime
            st.none() | st.floats(0, 1e5),  # started
            st.floats(0, 1e5),  # progress
            st.sampled_from(list(WorkloadKind)),
        ),
        max_size=6,
    ),
    times=st.lists(st.floats(0, 2e5) | st.integers(0, 200_000), min_size=1, max_size=6),
)
def test_node_remaining_runtime_remembers_only_the_time_it_was_asked_at(
    pods: list[tuple[float | None, float | None, float, WorkloadKind]], times: list[float]
) -> None:
    """The node keeps its last answer for one ``now``: asked at any sequence of times (repeats included), it
    answers what the pods say at that time, and a copy with another pod never answers from the original's."""
    core = [
        Pod(f"p{i}", Resources.request(1, 1), kind=kind, runtime_seconds=runtime, started_at=started,
            progress_seconds=progress)
        for i, (runtime, started, progress, kind) in enumerate(pods)
    ]  # fmt: skip
    node = Node("n", Resources.request(64, 1 << 40), pods=tuple(core))
    for now in [*times, *times]:
        assert node.remaining_runtime(now) == max((p.remaining_runtime(now) for p in core), default=0.0)
    longer = Pod("late", Resources.request(1, 1), kind=WorkloadKind.BATCH, runtime_seconds=1e9, started_at=0.0)
    grown = node.with_pod(longer)
    assert grown.remaining_runtime(times[-1]) == longer.remaining_runtime(times[-1])
