"""A short soak in the suite (a few seconds): random upstream faults, every answer checked, no leaks.

The full run is ``.venv/bin/python -m tests.soak.soak`` (see ``tests/soak/soak.py``).
"""

from __future__ import annotations

import logging

import pytest

from tests.soak.soak import run_soak


async def test_short_soak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="aiohttp.server")  # the chaos breaks connections on purpose
    report = await run_soak(requests=600, concurrency=32, seed=3, max_seconds=20, hang_after=10)
    assert report.ok, report.summary()
    assert report.sent == 600
    # The faults really happened and every kind of answer was seen.
    for outcome in ("ok", "stream_ok", "stream_error", "error_502", "client_abort"):
        assert report.outcomes[outcome] > 0, report.summary()
