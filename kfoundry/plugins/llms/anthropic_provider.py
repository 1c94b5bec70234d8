"""The ``anthropic`` provider: the Messages API through the official SDK.

``base_url`` is the server root (the SDK appends ``/v1/messages``). The key comes from the
environment variable named by ``api_key_env`` (default ``ANTHROPIC_API_KEY``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.core.llm.http import client_settings, sdk_errors
from kfoundry.core.llm.prompts import Prompt
from kfoundry.core.llm.provider import Completion, LLMProvider, ProviderOptions
from kfoundry.core.llm.retry import TransientError

if TYPE_CHECKING:  # the SDK is imported where a call is made: importing it takes about a second
    import anthropic

#: Below about 1024 tokens Anthropic does not cache a prefix.
_MIN_CACHED_CHARS = 4096


class AnthropicOptions(ProviderOptions):
    """Options of the ``anthropic`` provider."""

    temperature: float | None = Field(
        default=None, ge=0, le=1, description="Sampling temperature, sent only if set (newer models fix it)."
    )
    thinking_budget: int | None = Field(
        default=None, ge=1024, description="Extended-thinking token budget (None: no extended thinking)."
    )
    adaptive_thinking: bool = Field(default=False, description="Let the model decide how long to think.")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        default=None, description="Effort level (output_config.effort; None: not sent)."
    )
    prompt_cache: bool = Field(
        default=True, description="Mark the stable part of each prompt for Anthropic's prompt cache."
    )

    @model_validator(mode="after")
    def _hint_v1(self) -> AnthropicOptions:
        if self.base_url and extra_v1(self.base_url):
            warnings.warn(v1_hint(self.base_url), UserWarning, stacklevel=2)
        return self


def extra_v1(url: str) -> bool:
    """True when ``url`` ends in ``/v1``: the SDK appends ``/v1/messages`` itself."""
    return urlsplit(url).path.rstrip("/").endswith("/v1")


def v1_hint(url: str) -> str:
    root = url.rstrip("/")[: -len("/v1")]
    return (
        f"base_url {url} ends in /v1, but the Anthropic SDK appends /v1/messages itself; did you mean {root}?"
    )


class AnthropicProvider(LLMProvider):
    """Anthropic Messages API."""

    provider = "anthropic"
    default_model = "claude-sonnet-4-5"
    default_key_env = "ANTHROPIC_API_KEY"
    default_base_url = "https://api.anthropic.com"

    def __init__(self, options: AnthropicOptions) -> None:
        super().__init__(options)
        self.options: AnthropicOptions = options
        self._client: anthropic.Anthropic | None = None

    def client(self) -> anthropic.Anthropic:
        import anthropic

        if self._client is None:
            self._client = anthropic.Anthropic(**client_settings(self))
        return self._client

    def endpoint(self) -> str:
        return str(self._client.base_url).rstrip("/") if self._client is not None else super().endpoint()

    def _complete(self, prompt: Prompt, max_tokens: int) -> Completion:
        opts = self.options
        kwargs: dict[str, Any] = {
            "model": self.model,
            "system": prompt.system,
            "messages": [{"role": "user", "content": self._content(prompt)}],
            "max_tokens": max_tokens,
            "timeout": opts.timeout,
        }
        if opts.adaptive_thinking:
            kwargs["thinking"] = {"type": "adaptive"}
        elif opts.thinking_budget is not None:
            kwargs["thinking"] = {
                "type": "enabled",
                "budget_tokens": min(opts.thinking_budget, max_tokens - 1),
            }
        if opts.effort is not None:
            kwargs["output_config"] = {"effort": opts.effort}
        extra = dict(opts.extra_body)
        if opts.temperature is not None and "thinking" not in kwargs:
            extra.setdefault("temperature", opts.temperature)
        if opts.top_p is not None and "thinking" not in kwargs:
            extra.setdefault("top_p", opts.top_p)  # sent like temperature: newer SDKs leave it out
        if extra:
            kwargs["extra_body"] = extra
        import anthropic

        hint = v1_hint(opts.base_url) if opts.base_url and extra_v1(opts.base_url) else ""
        with sdk_errors(self, anthropic, anthropic.AnthropicError, not_found_hint=hint):
            resp = self.client().messages.create(**kwargs)
        return self._read(resp)

    def _content(self, prompt: Prompt) -> str | list[dict[str, Any]]:
        """The user message; its stable prefix as a cached block when it is long enough to be cached."""
        prefix = prompt.stable_prefix
        if not self.options.prompt_cache or len(prefix) < _MIN_CACHED_CHARS:
            return prompt.user
        return [
            {"type": "text", "text": prefix, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": prompt.user[len(prefix) :]},
        ]

    def _read(self, resp: object) -> Completion:
        from anthropic.types import Message

        if not isinstance(resp, Message):
            raise TransientError(
                f"llm {self.name}: malformed reply ({type(resp).__name__}, not a message)", kind="malformed"
            )
        content, usage = getattr(resp, "content", None), getattr(resp, "usage", None)
        if not isinstance(content, list):
            raise TransientError(f"llm {self.name}: malformed reply (no content list)", kind="malformed")
        parts = [getattr(b, "text", None) for b in content if getattr(b, "type", "") == "text"]
        text = "".join(p for p in parts if isinstance(p, str))
        if usage is None:  # the base class counts locally
            return Completion(text, 0, 0, getattr(resp, "stop_reason", "") or "", usage=False)
        tokens_in = sum(
            int(getattr(usage, f, 0) or 0)
            for f in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        tokens_out = int(getattr(usage, "output_tokens", 0) or 0)
        return Completion(text, tokens_in, tokens_out, getattr(resp, "stop_reason", "") or "")


@hookimpl
def kf_register_llms(register: Register) -> None:
    register("anthropic", AnthropicProvider, options=AnthropicOptions, description="Anthropic Messages API")
