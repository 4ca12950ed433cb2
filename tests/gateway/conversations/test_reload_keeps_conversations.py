"""A config reload keeps every stored response (the store is the process's, not the config's),
applies new bounds and TTL at once, and refuses a changed store by its YAML path."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest

from gateway.app import create_app
from gateway.configfile import load_config
from gateway.conversations import input_items, new_id
from gateway.reload import enable_reload
from gateway.responses_state import FinishedTurn
from gateway.state import STATE
from gateway.store import ANONYMOUS, MemoryStore
from tests.conftest import serve_app

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
backends: [{{name: sim, type: mock}}]
models: [{{name: m, routes: [{{backend: sim, model: m}}]}}]
responses: {{{responses}}}
"""


async def test_reload_keeps_conversations_and_applies_bounds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG.format(responses="max_items: 10"))
    app = create_app(load_config(path))
    reloader = enable_reload(app, path)
    runner, url = await serve_app(app)
    try:
        conversations = app[STATE].responses_state
        ids = [new_id("resp") for _ in range(3)]
        for rid in ids:
            turn = FinishedTurn({"id": rid, "model": "m", "output": []}, input_items("hi"), None)
            await conversations.save(ANONYMOUS, turn)
        path.write_text(CONFIG.format(responses="max_items: 2, ttl: 600"))
        assert await reloader.reload()
        assert app[STATE].responses_state is conversations
        memory = conversations.store
        assert isinstance(memory, MemoryStore) and memory.max_items == 2 and memory.ttl == 600
        async with aiohttp.ClientSession() as http:
            statuses = []
            for rid in ids:
                async with http.get(f"{url}/v1/responses/{rid}") as resp:
                    statuses.append(resp.status)
        assert statuses == [404, 200, 200]  # the oldest went to the new bound
        path.write_text(CONFIG.format(responses="store: 'redis://127.0.0.1:1/0'"))
        with caplog.at_level(logging.ERROR, logger="gateway.reload"):
            assert not await reloader.reload()
        assert any("responses.store" in r.getMessage() for r in caplog.records)
        assert app[STATE].responses_state.store is memory
    finally:
        await runner.cleanup()
