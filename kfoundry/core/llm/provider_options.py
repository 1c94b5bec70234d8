"""The options every HTTP provider shares, and the checks of a base URL and of extra headers."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kfoundry.core.llm.cost import Price, TokenizerMode

__all__ = ["ProviderOptions", "check_base_url"]


def check_base_url(url: str) -> str:
    """``url`` if it can be an API base URL (http or https, a host, a valid port); else ValueError."""
    if not url or url != url.strip() or any(c.isspace() for c in url):
        raise ValueError(f"base_url {url!r} must not be empty or contain spaces")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # bad port, bad IPv6 literal
        raise ValueError(f"base_url {url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        hint = f" (did you mean http://{url.split('://', 1)[-1].lstrip('/')}?)"
        raise ValueError(f"base_url {url!r} must start with http:// or https://{hint}")
    if not parts.hostname:
        rest = url.split(":", 1)[1].lstrip("/")
        raise ValueError(f"base_url {url!r} has no host (did you mean {parts.scheme}://{rest}?)")
    if port == 0:
        raise ValueError(f"base_url {url!r}: port 0 is not a server port")
    if parts.query or parts.fragment:
        raise ValueError(f"base_url {url!r} must not have a query or fragment")
    return url


#: Request fields kfoundry sets itself: ``extra_body`` may not override them (a larger completion
#: limit, several choices or a stream would break the caps or the reading of the reply).
_RESERVED_BODY = frozenset(
    {"model", "messages", "system", "max_tokens", "max_completion_tokens", "n", "stream", "stream_options"}
)


def _check_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            raise ValueError(f"header name {name!r} is not a valid HTTP header name")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"header {name}: value must be one line")
    return headers


class ProviderOptions(BaseModel):
    """Options every HTTP provider shares."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        default=None, description="API base URL (an OpenAI-compatible server's ends in /v1)."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the API key (None: the provider's default; '': no key).",
    )
    temperature: float | None = Field(
        default=0.7, ge=0, le=2, description="Sampling temperature (None: server default)."
    )
    max_tokens: int = Field(default=8192, ge=16, description="Completion token limit per call.")
    timeout: float = Field(default=300.0, gt=0, description="Seconds before one HTTP attempt times out.")
    max_retries: int = Field(
        default=4, ge=0, description="Retries on 429, 5xx, timeouts and malformed replies."
    )
    price: Price = Field(default_factory=Price, description="USD per million tokens (input, output).")
    templates: str | None = Field(
        default=None, description="Directory of Jinja2 templates overriding the bundled ones."
    )
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling (None: not sent).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra JSON fields merged into every request body (e.g. vLLM's top_k or "
        "repetition_penalty, Ollama's options).",
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra HTTP headers sent with every request (not for secrets)."
    )
    header_env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra HTTP headers whose values come from environment variables (header name -> "
        "variable); the values are masked like the key.",
    )
    tokenizer: TokenizerMode = Field(
        default="cached",
        description="Local token counts for OpenAI-family models: cached (tiktoken, only if its encoding "
        "is on this machine), download (tiktoken may fetch it), off (conservative estimate only).",
    )
    concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Calls to this provider in flight at once (a generation's requests go out together).",
    )
    max_failed_calls: int = Field(
        default=3,
        ge=1,
        description="Calls in a row without an answer (retries spent, or refused) after which the model "
        "counts as unreachable and the run stops (a server that refuses connections stops it at once).",
    )

    @field_validator("base_url")
    @classmethod
    def _valid_base_url(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)

    @field_validator("headers", "header_env")
    @classmethod
    def _valid_headers(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_headers(value)

    @field_validator("extra_body")
    @classmethod
    def _no_reserved_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & _RESERVED_BODY)
        if taken:  # the caps, the parsing and the recording rely on these
            raise ValueError(f"{', '.join(taken)}: set by kfoundry (use the provider's own options)")
        return value
