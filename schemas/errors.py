"""The one error taxonomy of the gateway and its OpenAI wire envelope.

Every failure a client can see is a :class:`GatewayError`. Code anywhere in the
request path raises one; the HTTP layer renders it exactly once, as::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

Tree::

    GatewayError                     500 api_error (never raised bare on purpose)
    ├── InvalidRequestError          400 invalid_request_error (param names the field)
    │   └── UnsupportedParameterError 400 code=unsupported_parameter
    ├── NotFoundError                404 (model_not_found, unknown path)
    ├── MethodNotAllowedError        405
    ├── PayloadTooLargeError         413
    ├── RateLimitError               429 rate_limit_error (+ Retry-After)
    └── ServiceUnavailableError      503 (+ Retry-After)

Upstream failures (``backends.errors``) subclass ``GatewayError`` too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ErrorBody",
    "ErrorEnvelope",
    "FieldRuleError",
    "GatewayError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
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


class RateLimitError(GatewayError):
    status = 429
    type = "rate_limit_error"


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
