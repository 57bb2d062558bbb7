"""kubelet backend (what can be tested without a kubelet), simulated backend through the whole protocol,
archives, configuration and the CLI entry."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from extender.agent import archive as arc
from extender.agent.backends.base import CheckpointResult, WorkloadRef
from extender.agent.backends.kubelet import (
    CRIO_LEGACY_NAME_ANNOTATION,
    checkpoint_annotations,
    checkpoint_archive_name,
    checkpoint_url,
    write_oci_layout,
)
from extender.agent.backends.simulated import PROGRESS_ANNOTATION, InMemoryProgressStore, SimulatedBackend
from extender.agent.client import AgentClient, PeerError
from extender.agent.events import RecordingEventSink, event_body
from extender.agent.faults import FaultInjection, FaultPoint
from extender.agent.server import Agent
from extender.agent.settings import (
    AgentConfig,
    AgentConfigError,
    AgentTlsConfig,
    MigrationPolicyConfig,
    find_criu,
    load_agent_config,
)
from extender.cli import build_parser
from tests.test_agent_support import serve_in_process

POD = WorkloadRef(namespace="batch", pod="train-7", container="worker")


# ------------------------------------------------------------------ kubelet (no kubelet here)
def test_kubelet_checkpoint_url() -> None:
    assert (
        checkpoint_url("10.0.0.5", 10250, POD, 60)
        == "https://10.0.0.5:10250/checkpoint/batch/train-7/worker?timeout=60"
    )
    assert checkpoint_url("fd00::5", 10250, POD, 5).startswith("https://[fd00::5]:10250/checkpoint/")
    odd = WorkloadRef(namespace="ns", pod="a b", container="c?d")
    assert checkpoint_url("n", 1, odd, 1) == "https://n:1/checkpoint/ns/a%20b/c%3Fd?timeout=1"
    with pytest.raises(ValueError):
        checkpoint_url("n", 1, WorkloadRef(namespace="ns", pod="p"), 1)
    with pytest.raises(ValueError):
        checkpoint_url("n", 1, POD, 0)


def test_kubelet_archive_name() -> None:
    when = datetime(2026, 3, 4, 12, 20, 30, tzinfo=UTC)
    assert checkpoint_archive_name("counters", "default", "counter", when) == (
        "checkpoint-counters_default-counter-2026-03-04T12:20:30Z.tar"
    )


def test_checkpoint_image_annotations_and_oci_layout(tmp_path: Path) -> None:
    ann = checkpoint_annotations(POD, rootfs_image="registry.local/train:1")
    assert ann["org.criu.checkpoint.container.name"] == "worker"
    assert ann[CRIO_LEGACY_NAME_ANNOTATION] == "worker"
    assert ann["org.criu.checkpoint.pod.namespace"] == "batch"
    assert ann["org.criu.checkpoint.rootfsImageName"] == "registry.local/train:1"
    archive = tmp_path / "checkpoint.tar"
    with tarfile.open(archive, "w") as tar:
        data = b"criu images"
        info = tarfile.TarInfo("checkpoint/pages-1.img")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    digest = write_oci_layout(archive, tmp_path / "oci", ann, "checkpoint-train-7")
    layout = tmp_path / "oci"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["digest"] == digest
    manifest = json.loads((layout / "blobs" / "sha256" / digest.split(":")[1]).read_text())
    assert manifest["annotations"]["org.criu.checkpoint.container.name"] == "worker"
    layer = manifest["layers"][0]
    assert (layout / "blobs" / "sha256" / layer["digest"].split(":")[1]).read_bytes() == archive.read_bytes()
    assert layer["size"] == archive.stat().st_size
    for blob in (layout / "blobs" / "sha256").iterdir():  # content-addressed
        assert arc.hash_file(blob).sha256 == blob.name


# ------------------------------------------------------------------ archives
def test_pack_unpack_roundtrip_and_hash(tmp_path: Path) -> None:
    src = tmp_path / "img"
    src.mkdir()
    (src / "core-1.img").write_bytes(b"\x00" * 1000)
    (src / "pages-1.img").write_bytes(bytes(range(256)) * 10)
    (src / "link").symlink_to("/etc/passwd")  # never packed
    info = arc.pack_dir(src, tmp_path / "img.tar")
    assert info.size == (tmp_path / "img.tar").stat().st_size and len(info.sha256) == 64
    assert arc.pack_dir(src, tmp_path / "again.tar").sha256 == info.sha256, "deterministic archives"
    names = arc.unpack(tmp_path / "img.tar", tmp_path / "out")
    assert names == ["core-1.img", "pages-1.img"]
    assert (tmp_path / "out" / "pages-1.img").read_bytes() == (src / "pages-1.img").read_bytes()


@pytest.mark.parametrize("kind", ["symlink", "traversal", "device"])
def test_unpack_refuses_hostile_archives(tmp_path: Path, kind: str) -> None:
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        if kind == "symlink":
            info = tarfile.TarInfo("x")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        elif kind == "traversal":
            info = tarfile.TarInfo("../../escape")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        else:
            info = tarfile.TarInfo("dev")
            info.type = tarfile.CHRTYPE
            tar.addfile(info)
    with pytest.raises(tarfile.TarError):
        arc.unpack(bad, tmp_path / "out")
    assert not (tmp_path.parent / "escape").exists()


# ------------------------------------------------------------------ config, faults, CLI
def test_config_refuses_strings_for_booleans_and_numbers_naming_every_error(tmp_path: Path) -> None:
    """Issue 28's security defect: `allow_plaintext: "false"` (a string) was truthy and started the agent without
    mTLS; `test_fault_injection: "false"` turned the fault endpoint on. Now each is refused by name, all at once."""
    (tmp_path / "c.yaml").write_text(
        'agent:\n  allow_plaintext: "false"\n  test_fault_injection: "false"\n  port: "9443"\n'
        '  events: 1\n  retry: {attempts: "3"}\n  kubelet: {port: 10250.5}\n  typo: 1\n'
    )
    with pytest.raises(AgentConfigError) as err:
        load_agent_config(str(tmp_path / "c.yaml"))
    paths = [p for p, _ in err.value.problems]
    assert sorted(paths) == sorted(
        ["allow_plaintext", "test_fault_injection", "port", "events", "retry.attempts", "kubelet.port", "typo"]
    )
    for path in paths:
        assert path in str(err.value)
    assert "'false'" in str(err.value)  # the offending value is shown
    # the same through the command line's overrides: a flag value is typed too
    with pytest.raises(AgentConfigError, match="allow_plaintext"):
        load_agent_config(None, allow_plaintext="true")


def test_config_defaults_demand_mtls(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="mTLS"):
        load_agent_config(None)
    cfg = load_agent_config(None, allow_plaintext=True, state_dir=str(tmp_path))
    assert cfg.retry.attempts == 3 and not cfg.test_fault_injection
    (tmp_path / "a.yaml").write_text(
        "agent:\n  allow_plaintext: true\n  retry: {attempts: 5, initial_backoff_seconds: 0.1}\n  backend: simulated\n"
    )
    cfg = load_agent_config(str(tmp_path / "a.yaml"))
    assert cfg.retry.attempts == 5 and cfg.backend == "simulated"
    for text, msg in [
        ("allow_plaintext: true\nbackend: docker\n", "backend"),
        ("allow_plaintext: true\nretyr: {}\n", "retyr: unknown option"),
        ("allow_plaintext: true\nretry: {attempts: 0}\n", "retry"),
        ("tls: {cert_file: a.crt}\n", "mTLS"),
    ]:
        (tmp_path / "b.yaml").write_text(text)
        with pytest.raises(AgentConfigError, match=msg):
            load_agent_config(str(tmp_path / "b.yaml"))


def test_find_criu_prefers_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "criu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("QOS_CRIU", str(fake))
    assert find_criu() == str(fake)
    assert find_criu(str(fake)) == str(fake)


def test_faults_are_off_by_default() -> None:
    f = FaultInjection()
    assert not f.fires(FaultPoint.SOURCE_CUT_TRANSFER)
    with pytest.raises(PermissionError):
        f.configure({"faults": {"source.transfer.cut": 1}})
    on = FaultInjection(enabled=True)
    on.configure({"faults": {"source.transfer.cut": 2}})
    assert [on.fires(FaultPoint.SOURCE_CUT_TRANSFER) for _ in range(3)] == [True, True, False]
    with pytest.raises(ValueError, match="unknown fault point"):
        on.configure({"faults": {"nope": 1}})


def test_cli_has_the_agent_subcommand() -> None:
    args = build_parser().parse_args(["agent", "--backend", "simulated", "--port", "0", "--host", "127.0.0.5"])
    assert args.backend == "simulated" and args.port == 0 and args.enable_test_fault_injection is None


def test_event_body() -> None:
    body = event_body(POD, "MigrationRolledBack", "x" * 2000, True, "node-a")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "train-7", "namespace": "batch"}
    assert body["type"] == "Warning" and len(body["message"]) == 1024


# ------------------------------------------------------------------ simulated backend, whole protocol
def _agent(tmp_path: Path, name: str, store: InMemoryProgressStore, events: RecordingEventSink) -> Agent:
    # plaintext (no identities) and no API server: the namespace rules only
    cfg = AgentConfig(node_name=name, allow_plaintext=True, state_dir=str(tmp_path / name), backend="simulated",
                      test_fault_injection=True, migration=MigrationPolicyConfig(check_pods=False))  # fmt: skip
    return Agent(cfg, SimulatedBackend(store), events=events)


async def test_simulated_migration_carries_progress_and_rolls_back_with_an_event(tmp_path: Path) -> None:
    store = InMemoryProgressStore()
    events = RecordingEventSink()
    src, dst = _agent(tmp_path, "kwok-1", store, events), _agent(tmp_path, "kwok-2", store, events)
    runners = []
    client = AgentClient(AgentTlsConfig())
    try:
        r1, u1 = await serve_in_process(src)
        r2, u2 = await serve_in_process(dst, "127.0.0.2")
        runners = [r1, r2]
        await store.put("batch", "job-a-src", 4321.5, stopped=False)
        await store.put("batch", "job-a-dst", None, stopped=False)
        body = {
            "id": "sim-1",
            "workload": {"namespace": "batch", "pod": "job-a-src"},
            "destination": {"url": u2, "workload": {"namespace": "batch", "pod": "job-a-dst"}},
        }
        rec = await client.request("POST", f"{u1}/v1/migrations", body)
        assert rec["outcome"] == "succeeded", rec
        assert await store.get("batch", "job-a-dst") == (4321.5, False), "resumes where it stopped"
        assert store.pods[("batch", "job-a-src")] == (None, True), "the source is stopped, its progress cleared"
        assert events.events[-1][:2] == ("batch/job-a-src", "MigrationSucceeded")
        assert src.metrics.work_preserved._value.get() == 4321.5

        # a destination that refuses the restore: rolled back, the source resumes with its progress, Event
        await store.put("batch", "job-b-src", 77.0, stopped=False)
        await client.request("PUT", f"{u2}/v1/test/faults", {"faults": {"destination.refuse.restore": 1}})
        body = {"id": "sim-2", "workload": {"namespace": "batch", "pod": "job-b-src"}, "destination": {"url": u2}}
        rec = await client.request("POST", f"{u1}/v1/migrations", body)
        assert rec["outcome"] == "rolled_back" and "refuses restore" in rec["reason"]
        assert await store.get("batch", "job-b-src") == (77.0, False)
        pod, reason, message, warning = events.events[-1]
        assert (pod, reason, warning) == ("batch/job-b-src", "MigrationRolledBack", True)
        assert "refuses restore" in message
        # idempotent by id: the recorded outcome, not a second migration
        again = await client.request("POST", f"{u1}/v1/migrations", body)
        assert again["outcome"] == "rolled_back" and again["updated"] == rec["updated"]
        # the destination's record says why, and its staging is gone
        drec = await client.request("GET", f"{u2}/v1/migrations/sim-2?role=destination")
        assert drec["state"] == "aborted"
        assert not list((tmp_path / "kwok-2" / "archives").glob("*/sim-2/*"))
        with pytest.raises(PeerError, match="404"):
            missing = {"workload": {"namespace": "batch", "pod": "nope"}, "destination": {"url": u2}}
            await client.request("POST", f"{u1}/v1/migrations", missing)
    finally:
        await client.close()
        for r in runners:
            await r.cleanup()
        await src.client.close()
        await dst.client.close()


class OneCheckpointBackend(SimulatedBackend):
    """The simulated backend declaring what the kubelet backend declares (``single_checkpoint``), counting its
    checkpoints: the coordinator must take one per move, not a pre-copy the final checkpoint replaces."""

    single_checkpoint = True

    def __init__(self, store: InMemoryProgressStore) -> None:
        super().__init__(store)
        self.checkpoints: list[bool] = []

    async def checkpoint(
        self, ref: WorkloadRef, image_dir: Path, *, leave_running: bool, parent_dir: Path | None = None
    ) -> CheckpointResult:
        self.checkpoints.append(leave_running)
        return await super().checkpoint(ref, image_dir, leave_running=leave_running, parent_dir=parent_dir)


async def test_a_single_checkpoint_backend_takes_one_checkpoint_per_move(tmp_path: Path) -> None:
    store = InMemoryProgressStore()
    events = RecordingEventSink()
    one = OneCheckpointBackend(store)
    cfg = AgentConfig(node_name="real-1", allow_plaintext=True, state_dir=str(tmp_path / "real-1"), backend="simulated",
                      migration=MigrationPolicyConfig(check_pods=False))  # fmt: skip
    src, dst = Agent(cfg, one, events=events), _agent(tmp_path, "real-2", store, events)
    client = AgentClient(AgentTlsConfig())
    runners = []
    try:
        r1, u1 = await serve_in_process(src)
        r2, u2 = await serve_in_process(dst, "127.0.0.2")
        runners = [r1, r2]
        await store.put("batch", "job-src", 99.5, stopped=False)
        await store.put("batch", "job-dst", None, stopped=False)
        body = {
            "id": "one-1",
            "workload": {"namespace": "batch", "pod": "job-src"},
            "destination": {"url": u2, "workload": {"namespace": "batch", "pod": "job-dst"}},
        }
        rec = await client.request("POST", f"{u1}/v1/migrations", body)
        assert rec["outcome"] == "succeeded", rec
        assert one.checkpoints == [False], "one checkpoint, the final one"
        assert set(rec["archives"]) == {"final"} and rec["bytes"] == rec["archives"]["final"]["size"]
        phases = [p for p, _ in rec["history"]]
        assert phases == ["new", "cutover", "final-dumped", "final-transferred", "restore-sent", "committed"], phases
        assert await store.get("batch", "job-dst") == (99.5, False)

        # the destination refuses to prepare (after the transfer, before any restore): rolled back, the source
        # resumes with its progress, the destination's staging is gone
        await store.put("batch", "job-b", 12.0, stopped=False)
        await client.request("PUT", f"{u2}/v1/test/faults", {"faults": {"destination.refuse.prepare": 1}})
        body = {"id": "one-2", "workload": {"namespace": "batch", "pod": "job-b"}, "destination": {"url": u2}}
        rec = await client.request("POST", f"{u1}/v1/migrations", body)
        assert rec["outcome"] == "rolled_back" and rec["failed_step"] == "prepare", rec
        assert one.checkpoints == [False, False]
        assert await store.get("batch", "job-b") == (12.0, False)
        assert not list((tmp_path / "real-2" / "archives").glob("*/one-2/*"))
    finally:
        await client.close()
        for r in runners:
            await r.cleanup()
        await src.client.close()
        await dst.client.close()


def test_progress_annotation_name() -> None:
    assert PROGRESS_ANNOTATION == "qos.kube-qos-extender.io/progress-seconds"


# ------------------------------------------------------------------ criu command construction (fake binary)
FAKE_CRIU = """#!/bin/sh
# TEST DOUBLE for argv construction only: records its arguments, writes the success line criu would log.
echo "$@" >> "$FAKE_CRIU_LOG"
dir=""; prev=""
for a in "$@"; do [ "$prev" = "-D" ] && dir="$a"; prev="$a"; done
[ -n "$dir" ] && mkdir -p "$dir" && echo "(00.01) Dumping finished successfully" > "$dir/dump.log"
exit 0
"""


async def test_criu_argv_with_and_without_dirty_tracking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The incremental pre-copy path cannot run on this kernel (no soft-dirty): check what it would run."""
    import subprocess

    from extender.agent.backends.criu import CriuBackend
    from extender.agent.settings import CriuConfig

    fake = tmp_path / "fake-criu"
    fake.write_text(FAKE_CRIU)
    fake.chmod(0o755)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_CRIU_LOG", str(log))
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        ref = WorkloadRef(pid=sleeper.pid)
        for dirty in (False, True):
            backend = CriuBackend(str(fake), CriuConfig())
            backend._features = {"dirty_tracking": dirty, "check_ok": True}
            base = tmp_path / f"dirty-{dirty}"
            pre = await backend.checkpoint(ref, base / "precopy", leave_running=True)
            fin = await backend.checkpoint(ref, base / "final", leave_running=False, parent_dir=base / "precopy")
            assert fin.meta["parent"] == ("precopy" if dirty else None)
            assert pre.meta["pre_dump"] is dirty
        lines = log.read_text().splitlines()
        assert lines[0].startswith("dump -t") and "--leave-running" in lines[0] and "--track-mem" not in lines[0]
        assert (
            lines[1].startswith("dump -t") and "--leave-running" not in lines[1] and "--prev-images-dir" not in lines[1]
        )
        assert lines[2].startswith("pre-dump -t") and "--track-mem" in lines[2] and "--leave-running" not in lines[2]
        assert lines[3].startswith("dump -t") and "--track-mem --prev-images-dir ../precopy" in lines[3]
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_quiesce_waits_for_a_criu_left_running_on_the_state_dir(tmp_path: Path) -> None:
    """A criu child survives its agent's SIGKILL; the restarted agent waits for it before reconciling."""
    import os
    import subprocess

    from extender.agent.backends.criu import CriuBackend
    from extender.agent.settings import CriuConfig

    state = tmp_path / "state"
    (state / "archives").mkdir(parents=True)
    impostor = tmp_path / "criu"  # TEST DOUBLE: a process whose argv[0] is "criu", working on our state dir
    os.symlink("/usr/bin/python3", impostor)
    proc = subprocess.Popen([str(impostor), "-S", "-c", "import time; time.sleep(1.0)", str(state / "archives")])
    # a criu working elsewhere (another agent's state dir) must not be waited for: it outlives both calls
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    other = subprocess.Popen([str(impostor), "-S", "-c", "import time; time.sleep(60)", str(elsewhere)])
    try:
        # Popen returns after fork but before the child's exec is visible in /proc under load: until then its cmdline
        # is pytest's, which no quiesce should wait for. Wait for both doubles to show argv[0] "criu" first.
        for p in (proc, other):
            for _ in range(400):
                cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes()
                if cmdline.startswith(str(impostor).encode() + b"\0"):
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError(f"the criu double {p.pid} never exec'd: {cmdline!r}")
        assert proc.poll() is None
        await CriuBackend("criu", CriuConfig()).quiesce(state, timeout=30)
        assert proc.poll() == 0, "quiesce returned while the criu on our state dir was still running"
        await CriuBackend("criu", CriuConfig()).quiesce(state, timeout=30)
        assert other.poll() is None, "quiesce waited for a criu that is not on our state dir"
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()


def test_agent_command_refuses_to_start_without_mtls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from extender.cli import main

    assert main(["agent", "--state-dir", str(tmp_path), "--backend", "simulated"]) == 2
    assert "mTLS" in capsys.readouterr().err
