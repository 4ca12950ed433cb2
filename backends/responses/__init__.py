"""``POST /v1/responses`` for every backend family: the Responses column of the backends.

- :mod:`~backends.responses.capabilities`: the Responses table type (native, or bridged: derived
  from a family's chat table) and the request's chat translation, made once per request;
- :mod:`~backends.responses.to_chat`, :mod:`~backends.responses.answer`, :mod:`~backends.responses.events`
  (with :mod:`~backends.responses.response_writer`, :mod:`~backends.responses.lifecycle_bytes`,
  :mod:`~backends.responses.text_run`), :mod:`~backends.responses.bridge`: the chat bridge (a
  Responses request as chat, a chat answer or stream as a Response or Responses events) for every
  family without a native endpoint;
- :mod:`~backends.responses.event_stream`: the contract of a Responses event stream, both kinds;
- :mod:`~backends.responses.native`: an upstream's own ``/v1/responses`` relayed (``openai``).

Each family's table lives in its own folder (``backends/<family>/capabilities.py``).
"""
