"""Errors in OpenAI's JSON shape, so an agent program's client reports them as it would OpenAI's.

An `ApiError` raised anywhere below a handler becomes `{"error": {"message", "type", "param",
"code"}}` with its HTTP status (the middleware in rollhub.rollout.gateway.app). The `openai`
package maps the status to its exception classes (400 BadRequestError, 404 NotFoundError,
409 ConflictError, 429 RateLimitError, 401 AuthenticationError), so a user mistake reads the same as it does against
OpenAI: what was wrong and how to fix it.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


class ApiError(Exception):
    """A request the gateway refuses; `status` is the HTTP status, `code` a stable machine-readable name."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        error_type = _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.code}}


def bad_param(param: str, message: str) -> ApiError:
    """A 400 for one request field, named in `param` the way OpenAI names it."""
    return ApiError(message, param=param, code="invalid_value")
