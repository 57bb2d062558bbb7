"""The pod and node watches split the API server's stream into events: whatever the chunk boundaries, every
non-blank line comes out whole and in order (issue 34 changed the splitting to one split per chunk)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.kube.watch import Reflector


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


class _Stream:
    """What Reflector._lines reads of aiohttp's response: ``content.iter_any()`` and ``release()``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)
        self.released = False

    def release(self) -> None:
        self.released = True


async def _collect(chunks: list[bytes]) -> tuple[list[bytes], bool]:
    stream = _Stream(chunks)
    reflector = Reflector.__new__(Reflector)
    lines = [line async for line in reflector._lines(stream)]
    return lines, stream.released


events = st.lists(st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=12)


@settings(max_examples=300, deadline=None)
@given(events=events, cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=10), trailing=st.booleans())
def test_every_line_comes_out_whole_whatever_the_chunks(events: list[bytes], cuts: list[int], trailing: bool) -> None:
    stream = b"\n".join(events) + (b"\n" if trailing else b"")
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    lines, released = asyncio.run(_collect(chunks))
    assert lines == [e for e in events if e.strip()]
    assert released


def test_blank_lines_and_a_last_line_without_newline() -> None:
    lines, _ = asyncio.run(_collect([b'{"a":1}\n\n  \n{"b"', b":2}\n{", b'"c":3}']))
    assert lines == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
