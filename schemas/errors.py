"""The one error taxonomy of the gateway and its OpenAI wire envelope.

Every failure a client can see is a :class:`GatewayError`. Code anywhere in the
request path raises one; the HTTP layer renders it exactly once, as::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

Tree::

    GatewayError                     500 api_error (never raised bare on purpose)
    ├── InvalidRequestError          400 invalid_request_error (param names the field)
    │   ├── UnsupportedParameterError 400 code=unsupported_parameter (the backend that refuses it)
    │   └── CapExceededError         400 code=cap_exceeded (a request cap of the deployment or the key)
    ├── BodyEncodingError            400/415 code=invalid_content_encoding (Content-Encoding)
    ├── AuthenticationError          401 authentication_error (no key, an unknown key)
    ├── PermissionDeniedError        403 permission_error (a model or endpoint the key may not use)
    ├── NotFoundError                404 (model_not_found, unknown path)
    ├── MethodNotAllowedError        405
    ├── RequestTimeoutError          408 code=request_timeout (the body came too slowly)
    ├── PayloadTooLargeError         413
    ├── ExpectationFailedError       417 code=expectation_failed (an ``Expect`` other than 100-continue)
    ├── RateLimitError               429 rate_limit_error (+ Retry-After)
    │   ├── BudgetExceededError      429 code=budget_exceeded (the key spent its budget; + Retry-After)
    │   └── QueueRejected            429 code=queue_full/queue_timeout (gateway.flow.admission)
    └── ServiceUnavailableError      503 (+ Retry-After)
        └── StoreUnavailableError    503 code=state_store_unavailable (gateway.store: Redis did not answer)

Upstream failures (``backends.errors``) subclass ``GatewayError`` too. Each class says its
``type`` and ``code``, which the metrics and the traces' ``error.type`` read.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AuthenticationError",
    "BodyEncodingError",
    "BudgetExceededError",
    "CapExceededError",
    "ErrorBody",
    "ErrorEnvelope",
    "ExpectationFailedError",
    "FieldRuleError",
    "GatewayError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTimeoutError",
    "ServiceUnavailableError",
    "UnsupportedParameterError",
]


class ErrorBody(BaseModel):
    """The inner object of OpenAI's error envelope."""

    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(BaseModel):
    """``{"error": {...}}``: the body of every non-2xx answer and of SSE error events."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorBody


MAX_MESSAGE_CHARS = 2048  # an upstream's message is already cut to 500 (backends.errors), after redaction
MAX_PARAM_CHARS = 256


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class GatewayError(Exception):
    """Base of every error that reaches a client.

    ``retry_after`` (seconds) becomes a ``Retry-After`` header when set.
    """

    status: int = 500
    type: str = "api_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        # Messages and params quote client input (a model name, an unknown field, a logit_bias key)
        # of any length a body allows: bound what is echoed, logged and kept, once, here.
        self.message = _bounded(message, MAX_MESSAGE_CHARS)
        self.param = None if param is None else _bounded(param, MAX_PARAM_CHARS)
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.retry_after = retry_after

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, message={self.message!r}, param={self.param!r})"


class InvalidRequestError(GatewayError):
    status = 400
    type = "invalid_request_error"


class UnsupportedParameterError(InvalidRequestError):
    code = "unsupported_parameter"

    def __init__(self, message: str, *, param: str, backend: str) -> None:
        super().__init__(message, param=param)
        self.backend = backend


class CapExceededError(InvalidRequestError):
    """Over a request cap (``caps:`` or ``auth.keys[].caps``): a bound on the request's size, not money."""

    code = "cap_exceeded"

    def __init__(self, message: str, *, param: str, cap: str) -> None:
        super().__init__(message, param=param)
        self.cap = cap  # which cap (n, best_of, max_tokens, prompts, total_tokens, prompt_array), for metrics


class BodyEncodingError(GatewayError):
    """The body's ``Content-Encoding`` is unknown (415) or the body does not decode per it (400)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_content_encoding"


class AuthenticationError(GatewayError):
    """401: no key, or one we do not know. The message never quotes the presented key."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    """403: a known key asking for something it may not use (a model, an admin endpoint)."""

    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class RequestTimeoutError(GatewayError):
    """408: the client sent its body too slowly (``server.client_body_timeout``)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class NotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"


class MethodNotAllowedError(GatewayError):
    status = 405
    type = "invalid_request_error"


class PayloadTooLargeError(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class ExpectationFailedError(GatewayError):
    """417: the request's ``Expect`` header asks for something other than ``100-continue``."""

    status = 417
    type = "invalid_request_error"
    code = "expectation_failed"


class RateLimitError(GatewayError):
    status = 429
    type = "rate_limit_error"


class BudgetExceededError(RateLimitError):
    """The key has spent its budget for the period (``auth.keys[].budget``); ``retry_after``: until it
    restarts (None for a ``total`` budget, which never does)."""

    code = "budget_exceeded"


class ServiceUnavailableError(GatewayError):
    status = 503
    type = "service_unavailable"


class FieldRuleError(ValueError):
    """Raised by request validators for a rule about one field.

    It subclasses ``ValueError`` so pydantic wraps it into its ``ValidationError``;
    the HTTP layer finds it again in the error's ``ctx`` and reads ``param``.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
