"""Create Bindings for the bind verb: idempotent, retried, and finished well within the scheduler's timeout.

kube-scheduler gives the extender ``httpTimeout`` (5 s default) for the whole call and retries a bind that
answered late, so a Binding may already exist when we are asked again: a pod already bound to the requested
node is success; bound elsewhere, or recreated under another UID, is a clear error.

The API server answers 409 Conflict both for "pod is already assigned to node X" and for a UID precondition
mismatch, so every 409 is resolved by reading the pod. 429, 5xx, timeouts and connection errors are retried
with exponential backoff (tenacity) until ``bind.timeout_seconds`` is spent; each attempt is cut at
``bind.attempt_timeout_seconds``. At most ``bind.max_in_flight`` binds are on the wire at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryError, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from extender.kube.binding import BindArgs, BindError
from extender.kube.client import ApiError, RawCore
from extender.settings.sections import BindConfig

__all__ = ["KubeBinder"]


# A bind that got its slot with less of its budget left than this fails without sending: a POST given a few
# milliseconds times out on the wire and leaves the bind in doubt (the pod then stays assumed on the node while
# kube-scheduler schedules it again), where failing before it is sent is definite.
_MIN_ATTEMPT_SECONDS = 1.0


class _Retry(Exception):
    """A transient failure worth another attempt. ``in_doubt``: the POST may have been applied (a timeout, a
    broken connection or a 5xx after sending it), unlike a 429 or a conflict read back as not bound."""

    def __init__(self, message: str, in_doubt: bool = False) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt


class _PodGone(BindError):
    """404: the pod does not exist (any more), so nothing an earlier attempt did can still hold its space."""


class KubeBinder:
    """``bind.max_in_flight`` binds hold a slot (and so a connection to the API server) at once; the others wait
    for one inside their budget. A bind whose budget runs out while it waits fails definitively: nothing was
    sent, so nothing is in doubt and its node's space is offered again at once."""

    def __init__(self, api_client: Any, config: BindConfig) -> None:
        self._core = RawCore(api_client)
        self._config = config
        self._slots = asyncio.Semaphore(config.max_in_flight)
        self.in_flight = 0  # binds holding a slot (qos_extender_binds{state})
        self.waiting = 0  # binds waiting for one

    async def bind(self, args: BindArgs) -> int:
        total = self._config.timeout_seconds
        start = time.monotonic()
        self.waiting += 1
        try:
            async with asyncio.timeout(total):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise BindError(
                f"could not bind {args.key} to {args.node}: {self._config.max_in_flight} binds were in flight for "
                f"the whole {total:g} s budget (bind.max_in_flight); nothing was sent"
            ) from exc
        finally:
            self.waiting -= 1
        self.in_flight += 1
        try:
            # The first attempt outside tenacity: nearly every bind succeeds at once, and building the retry
            # machinery for each (AsyncRetrying, its wait, stop and retry objects, its coroutine checks) was ~6 % of
            # the extender's CPU while a 2,000-pod burst bound (py-spy, issue 34). A retriable failure goes on below
            # with the same schedule: the same waits between attempts, the same budget, counted from ``start``.
            remaining = total - (time.monotonic() - start)
            if remaining < min(_MIN_ATTEMPT_SECONDS, total / 4):
                raise BindError(
                    f"could not bind {args.key} to {args.node}: waited {total - remaining:.1f} s of the {total:g} s "
                    f"budget for one of bind.max_in_flight ({self._config.max_in_flight}) slots; nothing was sent"
                )
            try:
                await self._attempt(args, max(0.05, min(self._config.attempt_seconds, remaining)))
                return 0
            except _Retry as exc:
                return await self._retry(args, start, exc)
        finally:
            self.in_flight -= 1
            self._slots.release()

    async def _retry(self, args: BindArgs, start: float, first: _Retry) -> int:
        """Attempts 2, 3, ... after a retriable first one, with exponential backoff until the budget is spent."""
        total = self._config.timeout_seconds
        initial = self._config.backoff_initial_seconds
        attempts = 1
        last: BaseException | None = first
        in_doubt = first.in_doubt
        if time.monotonic() - start >= total:  # the budget went in the first attempt
            raise BindError(
                f"could not bind {args.key} to {args.node} within {total:g} s (1 attempts): {first}",
                in_doubt=in_doubt,
            ) from first
        try:
            # the wait after attempt 1 (initial + up to initial of jitter), then 2 x initial, 4 x initial, ...
            await asyncio.sleep(min(initial + random.uniform(0, initial), total / 4))
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(max(0.0, total - (time.monotonic() - start))),
                wait=wait_exponential_jitter(multiplier=2 * initial, jitter=initial, max=total / 4),
                retry=retry_if_exception_type(_Retry),
                reraise=False,
            ):
                with attempt:
                    attempts += 1
                    remaining = total - (time.monotonic() - start)
                    try:
                        await self._attempt(args, max(0.05, min(self._config.attempt_seconds, remaining)))
                    except _Retry as exc:
                        last = exc
                        in_doubt |= exc.in_doubt
                        raise
        except RetryError as exc:
            raise BindError(
                f"could not bind {args.key} to {args.node} within {total:g} s ({attempts} attempts): {last}",
                retries=max(0, attempts - 1),
                in_doubt=in_doubt,
            ) from exc
        except BindError as exc:
            exc.retries = max(0, attempts - 1)
            # A refusal (403, 422, a recreated pod, ...) after an attempt that may have been applied does not undo
            # that attempt: its Binding may exist, so the failure stays in doubt and the pod assumed until the watch
            # says otherwise. Only a pod that is gone frees the space for certain.
            if in_doubt and not isinstance(exc, _PodGone):
                exc.in_doubt = True
            raise
        return max(0, attempts - 1)

    async def _attempt(self, args: BindArgs, timeout: float) -> None:
        body: Any = {  # a plain dict: the generated V1Binding model costs more than the call
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args.name, "namespace": args.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        if args.uid:
            body["metadata"]["uid"] = args.uid  # precondition: never bind a recreated pod of the same name
        try:
            async with asyncio.timeout(timeout):
                await self._core.create_namespaced_pod_binding(args.name, args.namespace, body, timeout=timeout)
            return
        except ApiError as exc:
            if exc.status == 409:
                await self._resolve_conflict(args, exc, timeout)
                return
            if exc.status == 429 or exc.status >= 500:
                raise _Retry(str(exc), in_doubt=exc.status != 429) from exc
            if exc.status == 404:
                raise _PodGone(f"cannot bind {args.key}: pod not found (deleted?)") from exc
            raise BindError(f"cannot bind {args.key} to {args.node}: {exc}") from exc
        except aiohttp.ClientConnectorError as exc:  # never connected: nothing was sent
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}", in_doubt=True) from exc

    async def _resolve_conflict(self, args: BindArgs, conflict: ApiError, timeout: float) -> None:
        """409: already bound (where?) or a UID mismatch. Success only if bound to the requested node."""
        try:
            async with asyncio.timeout(timeout):
                pod = await self._core.read_namespaced_pod(args.name, args.namespace, timeout=timeout)
        except ApiError as exc:
            if exc.status == 404:
                raise _PodGone(f"cannot bind {args.key}: pod not found (deleted?)") from exc
            raise _Retry(f"conflict ({conflict.message}), then reading the pod failed: {exc}", True) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _Retry(f"conflict ({conflict.message}), then reading the pod failed: {exc}", True) from exc
        uid = (pod.get("metadata") or {}).get("uid", "")
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if args.uid and uid != args.uid:
            raise BindError(f"cannot bind {args.key}: the pod was recreated (uid {uid}, asked for {args.uid})")
        if node == args.node:
            return  # a previous attempt (or an earlier call) already bound it: idempotent success
        if node:
            raise BindError(f"cannot bind {args.key} to {args.node}: it is already bound to node {node!r}")
        raise _Retry(f"conflict without a binding: {conflict.message}")
