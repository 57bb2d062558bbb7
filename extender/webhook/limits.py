"""Reading a request body within a size and a time: what a route that anyone may reach needs (admission).

aiohttp's ``client_max_size`` is one limit for the whole app and is checked only as the body arrives, with no
deadline: a client that declares 64 MiB and sends a byte a second holds a connection and a growing buffer for as
long as it likes. Here a declared length over the limit is refused before a byte is read, a longer stream is
cut at the limit, and the whole body must arrive within the deadline.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

__all__ = ["BodyRefused", "read_bounded"]

_CHUNK = 64 * 1024


class BodyRefused(Exception):
    """``status`` 413 (too large) or 408 (too slow); ``reason`` the metric label."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


async def read_bounded(request: web.Request, limit: int, timeout: float) -> bytes:
    """The body, at most ``limit`` bytes, all of it within ``timeout`` seconds; else BodyRefused. The connection
    is not kept alive after a refusal (what is left of the body is never read)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyRefused(413, "body_too_large", f"request body of {declared} bytes is over the limit of {limit}")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await request.content.read(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise BodyRefused(413, "body_too_large", f"request body is over the limit of {limit} bytes")
                parts.append(chunk)
    except TimeoutError as exc:
        raise BodyRefused(
            408, "read_timeout", f"request body not received within {timeout:g} s ({size} bytes arrived)"
        ) from exc
    return b"".join(parts)
