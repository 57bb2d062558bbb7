"""KubeBinder's outcome when attempts end differently: a real HTTP server (asyncio streams, no mocks of the
client) answers each Binding POST as scripted: hang (the attempt times out after the POST was sent, so the
Binding may exist), or a status code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from extender.kube.binder import KubeBinder
from extender.kube.binding import BindArgs, BindError
from extender.settings.extender import BindConfig, parse_config

ARGS = BindArgs("default", "p", "uid-1", "node-1")
CONFIG = BindConfig(timeout_seconds=2.0, attempt_timeout_seconds=0.2, backoff_initial_seconds=0.01)


class ScriptedApi:
    """Answers the n-th request with ``script[n]`` (the last entry repeats): "hang" never answers, "slow:S"
    answers 201 after S seconds, an int is a Status of that code."""

    def __init__(self, script: Sequence[str | int]) -> None:
        self.script = list(script)
        self.requests = 0
        self.targets: list[str] = []  # each request line's target (path and query)
        self.open = 0  # requests read and not answered yet
        self.most_open = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.targets.append(head.decode().split(" ", 2)[1])
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            await reader.readexactly(length)
            step = self.script[min(self.requests, len(self.script) - 1)]
            self.requests += 1
            self.open += 1
            counted = True
            self.most_open = max(self.most_open, self.open)
            if step == "hang":
                await asyncio.sleep(30)
                return
            if isinstance(step, str) and step.startswith("slow:"):  # a loaded API server: applied, but late
                await asyncio.sleep(float(step.split(":", 1)[1]))
                step = 201
            code = int(step)
            body = json.dumps({"kind": "Status", "code": code, "message": f"scripted {code}"}).encode()
            writer.write(
                f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if counted:
                self.open -= 1
            writer.close()

    async def __aenter__(self) -> Any:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.api = k8s.ApiClient(configuration=k8s.Configuration(host=f"http://127.0.0.1:{port}"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.api.close()
        assert self.server is not None
        self.server.close()


@pytest.fixture
async def scripted() -> AsyncIterator[type[ScriptedApi]]:
    yield ScriptedApi


@pytest.mark.parametrize("terminal", [403, 422])
async def test_a_terminal_refusal_after_an_in_doubt_attempt_stays_in_doubt(
    scripted: type[ScriptedApi], terminal: int
) -> None:
    """The first POST timed out (it may have been applied), the re-send is refused for good: the Binding made
    by the first may exist, so the failure is still in doubt and the pod stays assumed (not offered again)."""
    async with scripted(["hang", terminal]) as api:
        with pytest.raises(BindError) as info:
            await KubeBinder(api.api, CONFIG).bind(ARGS)
        assert api.requests == 2
        assert info.value.in_doubt
        assert f"scripted {terminal}" in str(info.value)
        assert info.value.retries == 1


async def test_a_terminal_refusal_on_the_first_attempt_is_definite(scripted: type[ScriptedApi]) -> None:
    async with scripted([403]) as api:
        with pytest.raises(BindError) as info:
            await KubeBinder(api.api, CONFIG).bind(ARGS)
        assert api.requests == 1
        assert not info.value.in_doubt


async def test_pod_gone_after_an_in_doubt_attempt_is_definite(scripted: type[ScriptedApi]) -> None:
    """404: the pod no longer exists, whatever the first attempt did: nothing to keep assumed."""
    async with scripted(["hang", 404]) as api:
        with pytest.raises(BindError) as info:
            await KubeBinder(api.api, CONFIG).bind(ARGS)
        assert api.requests == 2
        assert not info.value.in_doubt
        assert "not found" in str(info.value)


async def test_a_slow_binding_is_awaited_not_sent_again(scripted: type[ScriptedApi]) -> None:
    """A Binding POST the API server is slow to apply is awaited for the whole bind budget by default (no
    attempt timeout configured): cutting it and sending it again doubled a loaded API server's work and, with a
    3 s budget, failed 3,039 of 4,755 binds in a 2,000-pod burst (issue 17)."""
    bind_config = parse_config({"bind": {"timeout_seconds": 2.0}}).bind
    assert bind_config.attempt_timeout_seconds is None and bind_config.attempt_seconds == 2.0
    async with scripted(["slow:1.2", 409]) as api:
        retries = await KubeBinder(api.api, bind_config).bind(ARGS)
        assert (api.requests, retries) == (1, 0)


async def test_429s_are_retried_on_the_backoff_schedule_and_counted(scripted: type[ScriptedApi]) -> None:
    """The first attempt runs outside the retry loop (issue 34: tenacity's setup on every bind was ~6 % of the
    extender's CPU in a burst); a retriable answer goes on in the loop: two 429s, then the Binding, is 2 retries
    and 3 POSTs, never a definite failure."""
    async with scripted([429, 429, 201]) as api:
        retries = await KubeBinder(api.api, CONFIG).bind(ARGS)
        assert (api.requests, retries) == (3, 2)


async def test_a_first_attempt_that_spends_the_budget_is_not_sent_again(scripted: type[ScriptedApi]) -> None:
    """No attempt timeout: the first POST hangs for the whole budget. Nothing is re-sent after the budget, and
    the failure is in doubt (the POST may have been applied)."""
    bind_config = parse_config({"bind": {"timeout_seconds": 0.3}}).bind
    async with scripted(["hang"]) as api:
        with pytest.raises(BindError) as info:
            await KubeBinder(api.api, bind_config).bind(ARGS)
        assert api.requests == 1
        assert info.value.in_doubt and info.value.retries == 0
        assert "within 0.3 s (1 attempts)" in str(info.value)


async def test_no_more_binds_than_max_in_flight_reach_the_api_server(scripted: type[ScriptedApi]) -> None:
    """kube-scheduler calls /bind for every pod it scheduled at once; each POST in flight holds a TLS connection.
    Uncapped, a 10,000-pod burst on 5,000 nodes swamped the API server with connections and every bind timed out
    in doubt (issue 34). Twelve binds through a binder allowed three: never more than three at the server, all
    bound."""
    bind_config = parse_config({"bind": {"timeout_seconds": 5.0, "max_in_flight": 3}}).bind
    async with scripted(["slow:0.05"]) as api:
        binder = KubeBinder(api.api, bind_config)
        many = [BindArgs("default", f"p{i}", f"uid-{i}", "node-1") for i in range(12)]
        assert await asyncio.gather(*(binder.bind(a) for a in many)) == [0] * 12
        assert api.requests == 12 and api.most_open == 3
        assert (binder.in_flight, binder.waiting) == (0, 0)


async def test_a_bind_that_never_got_a_slot_fails_definitively_and_sends_nothing(
    scripted: type[ScriptedApi],
) -> None:
    """Its budget ran out while max_in_flight binds were on the wire: nothing was sent, so the failure is not in
    doubt (the pod's assumption is dropped and its node's space offered again at once)."""
    bind_config = parse_config({"bind": {"timeout_seconds": 0.3, "max_in_flight": 1}}).bind
    async with scripted([201]) as api:
        binder = KubeBinder(api.api, bind_config)
        await binder._slots.acquire()  # the one slot, held as by a bind whose POST is still on the wire
        with pytest.raises(BindError) as info:
            await binder.bind(ARGS)
        assert not info.value.in_doubt and "nothing was sent" in str(info.value)
        assert api.requests == 0 and binder.waiting == 0
        binder._slots.release()
        assert await binder.bind(ARGS) == 0  # the slot free again: bound
        assert api.requests == 1


async def test_a_slot_got_too_late_to_send_in_fails_definitively(scripted: type[ScriptedApi]) -> None:
    """The slot came free with less than a quarter of the budget left: a POST with so little time would time out on
    the wire and leave the bind in doubt, so it is not sent (a definite failure: the pod is offered again)."""
    bind_config = parse_config({"bind": {"timeout_seconds": 0.4, "max_in_flight": 1}}).bind
    async with scripted([201]) as api:
        binder = KubeBinder(api.api, bind_config)
        await binder._slots.acquire()
        asyncio.get_running_loop().call_later(0.35, binder._slots.release)  # 0.05 s of 0.4 left: under 0.1
        with pytest.raises(BindError) as info:
            await binder.bind(ARGS)
        assert not info.value.in_doubt and "nothing was sent" in str(info.value)
        assert api.requests == 0 and (binder.in_flight, binder.waiting) == (0, 0)
        assert await binder.bind(ARGS) == 0 and api.requests == 1  # its slot was given back
