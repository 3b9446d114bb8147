"""GatewayConfig: what the OpenAI-compatible session gateway allows and how it answers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatewayConfig:
    """Limits and defaults of the gateway; `validate()` runs where the gateway is built."""

    model_name: str = "rollhub-policy"  # the id `/v1/models` lists and requests must name
    # most generation calls running at once; one more gets HTTP 429 with Retry-After (None = no cap)
    max_in_flight: int | None = None
    retry_after_s: int = 1  # the Retry-After a refused call is told to wait
    # prompt + completion must fit; None = the engine's `max_positions` (else 4096)
    max_context_tokens: int | None = None
    default_max_tokens: int = 256  # completion length when a request names none
    max_choices: int = 16  # cap on `n`
    max_resubmits: int = 16  # an aborted generation (weight update) is resumed at most this often
    # every response carries the prompt and completion token ids, log-probs and policy versions
    # in the `rollhub` extension field (clients that do not know it ignore it)
    return_tokens: bool = True
    max_body_bytes: int = 8 * 1024 * 1024
    # sampling a training run pins (the trainer scores tokens at its own temperature and top-p): a
    # request may leave these out or name the same value; None = each request decides (serving)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = -1  # sample among the k likeliest tokens (not in OpenAI's API): -1 = off
    # keys a caller must send as `Authorization: Bearer KEY` (empty = no authentication, loopback only);
    # with keys set, each session also gets its own key that opens that session's routes only
    api_keys: tuple[str, ...] = ()
    # a reward beyond +-max_abs_reward is refused (400): no task pays 1e308, a bug or an attack does
    max_abs_reward: float = 1e6
    # hostile or broken programs: a session idle this long without /end is ended as failed (None = never)
    session_idle_timeout_s: float | None = 900.0
    max_calls_per_session: int | None = 1000  # one more call on the session gets 400 session_call_limit
    max_open_sessions: int | None = 10000  # one more POST /rl/sessions gets 429 with Retry-After
    # generation calls one session may have running at once (a flooding program waits its own turn: 429)
    max_in_flight_per_session: int | None = 64

    def validate(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must be a non-empty string")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or null (no cap), got {self.max_in_flight}")
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2 or null (the engine's), got {self.max_context_tokens}")
        if self.default_max_tokens < 1 or self.max_choices < 1 or self.max_resubmits < 0:
            raise ValueError("default_max_tokens and max_choices must be >= 1, max_resubmits >= 0")
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2] or null, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or null, got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if any(not isinstance(key, str) or len(key) < 8 for key in self.api_keys):
            raise ValueError("each api key must be a string of at least 8 characters")
        if not self.max_abs_reward > 0:
            raise ValueError(f"max_abs_reward must be > 0, got {self.max_abs_reward}")
        if self.session_idle_timeout_s is not None and not self.session_idle_timeout_s > 0:
            raise ValueError(f"session_idle_timeout_s must be > 0 or null, got {self.session_idle_timeout_s}")
        for name in ("max_calls_per_session", "max_open_sessions", "max_in_flight_per_session"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or null (no cap), got {value}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
