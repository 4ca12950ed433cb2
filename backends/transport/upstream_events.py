"""The reading half of every relayed upstream stream: the body's reads to blocks of whole events.

:class:`UpstreamEvents` is shared by the OpenAI-shaped relay (bytes for the client) and the
native streams (choice deltas); each subclass says only what a block of events becomes
(:meth:`UpstreamEvents._process`). The pull loop is written once here and bound by the
subclass to its protocol's pull method as an alias (``__anext__ = UpstreamEvents._pull``),
not called from one: one Python call per upstream read is the SSE hot path's budget
(``bench/request_cost.py``).

Contract of the loop: a body that ends before the upstream's last event raises
``UpstreamProtocolError`` (reason ``stream_cut``); a failure that follows events in the same
block is kept in ``_pending`` and raised at the next pull, so the events before it still reach
the client; ``finished`` turns true at the upstream's clean end.

Who closes what: the response is released exactly once, on any failure or at :meth:`aclose`,
which first drains (bounded) what the upstream still sends after its last event so the
connection can be reused.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, Generic, TypeVar

from backends.errors import UpstreamError, UpstreamProtocolError
from backends.transport.base import UpstreamResponse
from backends.transport.sse import EventBuffer

__all__ = ["UpstreamEvents"]

_DRAIN_SECONDS = 1.0
_Out = TypeVar("_Out")


class UpstreamEvents(Generic[_Out]):
    """An upstream body read as blocks of whole events (module docstring). Not thread-safe."""

    # The message of a body that ends too soon: what the upstream's last event is called.
    _cut_message: ClassVar[str]
    finished: bool = False

    def __init__(self, resp: UpstreamResponse, backend: str, *, sep: bytes, max_event: int) -> None:
        self._resp = resp
        self._chunks = resp.iter_chunks()
        self._backend = backend
        self._events = EventBuffer(sep, max_event, backend)
        self._pending: UpstreamError | None = None
        self._released = False

    def _process(self, block: bytes) -> _Out:
        """What ``block`` (whole events) gives the consumer, empty for nothing yet.

        Sets ``finished`` at the last event and ``_pending`` for a failure after events.
        """
        raise NotImplementedError

    async def _pull(self) -> _Out:
        if self._pending is not None:
            error, self._pending = self._pending, None
            self._release()
            raise error
        while not self.finished:
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._release()
                raise UpstreamProtocolError(self._cut_message, backend=self._backend, reason="stream_cut") from None
            except BaseException:
                self._release()
                raise
            try:
                block = self._events.feed(chunk)
            except UpstreamError:
                self._release()
                raise
            if not block:
                continue
            out = self._process(block)
            if out:
                return out
            if self._pending is not None:
                return await self._pull()
        raise StopAsyncIteration

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._resp.release()

    async def aclose(self) -> None:
        try:
            if self.finished and not self._released and self._pending is None:
                # After the last event read the body's end so the connection goes back to the pool.
                # Done after the consumer got its last events, and bounded, so an upstream that
                # keeps the body open costs a closed connection, not a hang.
                try:
                    async with asyncio.timeout(_DRAIN_SECONDS):
                        async for _ in self._chunks:
                            pass
                except Exception:
                    pass
        finally:  # a cancel during the drain (the client left after its last event) still releases
            self.finished = True
            self._release()
