"""The private corners of aiohttp that the front door relies on are still there, as it uses them.

``gateway/http/protocol.py`` (and ``middleware.py``) subclass and read parts of aiohttp that are
not its public API: the runner's ``_make_server``, the ``Server``'s protocol factory and its
connection table, the connection protocol's request factory and waiter state, the module
default for the ``Server`` header, the app's body limit. An aiohttp release may rename any of
them without notice, and some failures would be silent (an override nobody calls any more
drops the lossless drain). ``pyproject.toml`` pins aiohttp to the minor release these tests ran
on; before widening the pin, this test must pass on the new release, and each failure names
the attribute, what the gateway does with it and where.
"""

from __future__ import annotations

import inspect
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import http_parser, web, web_response
from aiohttp.web_protocol import RequestHandler
from packaging.requirements import Requirement
from packaging.version import Version

from gateway.http.protocol import FrontDoorProtocol, FrontDoorRunner

ROOT = Path(__file__).resolve().parents[3]
PROTOCOL = "gateway/http/protocol.py"


def _broken(attribute: str, use: str, where: str) -> str:
    return (
        f"aiohttp {aiohttp.__version__}: {attribute} is gone or changed shape. The gateway relies on it: "
        f"{use} ({where}). Adapt that code to this aiohttp, or keep the pin in pyproject.toml."
    )


def _parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


# (attribute, the parameters the gateway's override has, what the override does, where)
OVERRIDDEN: list[tuple[type, str, list[str], str, str]] = [
    (web.AppRunner, "_make_server", ["self"],
     "FrontDoorRunner swaps the Server it builds for one whose protocol answers in OpenAI's envelope",
     f"{PROTOCOL} FrontDoorRunner._make_server"),
    (web.Server, "__call__", ["self"],
     "the Server's protocol factory: _FrontDoorServer makes a FrontDoorProtocol per connection",
     f"{PROTOCOL} _FrontDoorServer.__call__"),
    (RequestHandler, "handle_error", ["self", "request", "status", "exc", "message"],
     "malformed HTTP is answered in our envelope, never echoing the client's bytes",
     f"{PROTOCOL} FrontDoorProtocol.handle_error"),
    (RequestHandler, "finish_response", ["self", "request", "resp", "start_time"],
     "while draining, answers close their connection; the idle clock restarts after each answer",
     f"{PROTOCOL} FrontDoorProtocol.finish_response"),
    (RequestHandler, "log_exception", ["self", "args", "kw"],
     "a body that failed to decode is logged as one INFO line, not a traceback quoting it",
     f"{PROTOCOL} FrontDoorProtocol.log_exception"),
    (RequestHandler, "connection_made", ["self", "transport"],
     "a new connection starts its idle clock",
     f"{PROTOCOL} FrontDoorProtocol.connection_made"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("owner", "name", "parameters", "use", "where"), OVERRIDDEN, ids=[f"{o.__name__}.{n}" for o, n, *_ in OVERRIDDEN]
)
def test_the_methods_the_front_door_overrides(
    owner: type, name: str, parameters: list[str], use: str, where: str
) -> None:
    method = vars(owner).get(name)
    assert callable(method), _broken(f"{owner.__module__}.{owner.__qualname__}.{name}", use, where)
    assert _parameters(method) == parameters, _broken(
        f"the signature of {owner.__qualname__}.{name} (now {_parameters(method)})", use, where
    )


async def test_the_state_the_front_door_reads() -> None:
    """Instance attributes exist only once built: build the runner, its Server and a protocol."""
    runner = FrontDoorRunner(web.Application())
    await runner.setup()
    try:
        server = runner.server
        assert server is not None
        for name, use in (
            ("_kwargs", "the protocol options (limits, timeouts) the gateway's protocol is built with"),
            ("_loop", "the event loop the gateway's protocol is built on"),
            ("_connections", "open connections, counted and closed when idle during a drain"),
        ):
            assert hasattr(server, name), _broken(f"web.Server.{name}", use, f"{PROTOCOL} FrontDoorRunner")
        assert isinstance(server._connections, dict), _broken(
            "web.Server._connections (a dict of protocols)", "the drain walks it", f"{PROTOCOL} close_idle"
        )
        protocol = server()
        assert isinstance(protocol, FrontDoorProtocol), _broken(
            "web.Server.__call__", "the Server built by AppRunner._make_server gets our protocol", PROTOCOL
        )
        for name, use, where in (
            ("_request_factory", "a request arriving while draining is made with Connection: close",
             "FrontDoorProtocol.__init__"),
            ("_loop", "the idle clock reads the loop's time", "FrontDoorProtocol.connection_made"),
            ("_request_in_progress", "a connection serving a request is not idle", "FrontDoorProtocol.idle_for"),
            ("_messages", "a connection with a request buffered is not idle", "FrontDoorProtocol.idle_for"),
            ("_waiter", "only a connection waiting for its next request is idle", "FrontDoorProtocol.idle_for"),
        ):  # fmt: skip
            assert name in _slots_and_attributes(protocol), _broken(
                f"web_protocol.RequestHandler.{name}", use, f"{PROTOCOL} {where}"
            )
        assert protocol._waiter is None and protocol._request_in_progress is False, _broken(
            "RequestHandler._waiter / _request_in_progress (None / False on a fresh connection)",
            "they tell an idle keep-alive connection from a busy one",
            f"{PROTOCOL} FrontDoorProtocol.idle_for",
        )
    finally:
        await runner.cleanup()


def _slots_and_attributes(obj: object) -> set[str]:
    names = set(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if hasattr(obj, slot):
                names.add(slot)
    return names


def test_the_module_and_message_fields_the_front_door_uses() -> None:
    assert isinstance(getattr(web_response, "SERVER_SOFTWARE", None), str), _broken(
        "aiohttp.web_response.SERVER_SOFTWARE",
        "the Server header's default, set once so that no answer names aiohttp and its version",
        f"{PROTOCOL} _hide_server_software",
    )
    assert "SERVER_SOFTWARE" in inspect.getsource(web_response.StreamResponse), _broken(
        "StreamResponse's use of SERVER_SOFTWARE", "the Server header's default", f"{PROTOCOL} _hide_server_software"
    )
    for kind in _message_classes():
        replaced = None
        try:
            fields = dict.fromkeys(http_parser.RawRequestMessagePy._fields)
            message = kind(**{**fields, "method": "GET", "path": "/", "should_close": False})
            replaced = message._replace(should_close=True)
        except (AttributeError, TypeError):
            pass
        assert replaced is not None and replaced.should_close is True and replaced.path == "/", _broken(
            f"{kind.__module__}.{kind.__qualname__}._replace(should_close=...)",
            "a request arriving while draining is answered with Connection: close",
            f"{PROTOCOL} FrontDoorProtocol.__init__",
        )
    assert web.Application(client_max_size=1234)._client_max_size == 1234, _broken(
        "web.Application._client_max_size",
        "the 413 and the 100-continue refusal name the body limit",
        "gateway/http/middleware.py",
    )


def _message_classes() -> list[type]:
    """The request message types of both of aiohttp's parsers (the C one where it is built)."""
    kinds: list[type] = [http_parser.RawRequestMessagePy]
    compiled = getattr(http_parser, "RawRequestMessageC", None)
    if compiled is not None:
        kinds.append(compiled)
    return kinds


def test_aiohttp_is_pinned_to_the_minor_release_tested() -> None:
    """The pin admits the aiohttp running these tests and no later minor release."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (pin,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "aiohttp"]
    installed = Version(aiohttp.__version__)
    assert pin.specifier.contains(installed), f"aiohttp {installed} runs the tests but the pin is {pin.specifier}"
    next_minor = f"{installed.major}.{installed.minor + 1}.0"
    assert not pin.specifier.contains(next_minor), (
        f"pyproject.toml allows aiohttp {next_minor} ({pin.specifier}), a release no test has run on"
    )
