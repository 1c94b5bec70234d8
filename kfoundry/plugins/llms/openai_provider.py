"""The ``openai`` provider: chat completions through the official SDK.

``base_url`` points it at any OpenAI-compatible server (vLLM, Ollama, llama.cpp server); such a
server's base URL ends in ``/v1``. The key comes from the environment variable named by
``api_key_env`` (default ``OPENAI_API_KEY``).
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

if TYPE_CHECKING:  # the SDK is imported where a call is made: importing it takes about half a second
    import openai


class OpenAIOptions(ProviderOptions):
    """Options of the ``openai`` provider."""

    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = Field(
        default=None, description="Reasoning effort for reasoning models (None: not sent)."
    )
    token_param: Literal["max_tokens", "max_completion_tokens"] | None = Field(
        default=None,
        description="Name of the completion-limit field (None: max_completion_tokens for api.openai.com, "
        "max_tokens for other servers).",
    )
    seed: int | None = Field(default=None, description="Sampling seed, where the server honours it.")

    @model_validator(mode="after")
    def _hint_v1(self) -> OpenAIOptions:
        if self.base_url and missing_v1(self.base_url):
            warnings.warn(v1_hint(self.base_url), UserWarning, stacklevel=2)
        return self


def missing_v1(url: str) -> bool:
    """True when ``url`` has no path at all: OpenAI-compatible servers (vLLM, Ollama, LM Studio) serve
    the API under ``/v1``, so the SDK's ``/chat/completions`` would miss it."""
    return urlsplit(url).path.strip("/") == ""


def v1_hint(url: str) -> str:
    return (
        f"base_url {url} has no /v1: OpenAI-compatible servers (vLLM, Ollama, LM Studio, llama.cpp) "
        f"serve the API under /v1; did you mean {url.rstrip('/')}/v1?"
    )


class OpenAIProvider(LLMProvider):
    """Chat completions (OpenAI or any compatible server)."""

    provider = "openai"
    default_model = "gpt-5-mini"
    default_key_env = "OPENAI_API_KEY"
    default_base_url = "https://api.openai.com/v1"

    def __init__(self, options: OpenAIOptions) -> None:
        super().__init__(options)
        self.options: OpenAIOptions = options
        self._client: openai.OpenAI | None = None

    def client(self) -> openai.OpenAI:
        import openai

        if self._client is None:
            self._client = openai.OpenAI(**client_settings(self))
        return self._client

    def endpoint(self) -> str:
        return str(self._client.base_url).rstrip("/") if self._client is not None else super().endpoint()

    def _complete(self, prompt: Prompt, max_tokens: int) -> Completion:
        opts = self.options
        field = opts.token_param or ("max_tokens" if opts.base_url else "max_completion_tokens")
        kwargs: dict[str, Any] = {"model": self.model, "messages": prompt.messages(), field: max_tokens}
        if opts.temperature is not None:
            kwargs["temperature"] = opts.temperature
        if opts.reasoning_effort is not None:
            kwargs["reasoning_effort"] = opts.reasoning_effort
        if opts.seed is not None:
            kwargs["seed"] = opts.seed
        if opts.top_p is not None:
            kwargs["top_p"] = opts.top_p
        if opts.extra_body:
            kwargs["extra_body"] = dict(opts.extra_body)
        import openai

        hint = v1_hint(opts.base_url) if opts.base_url and missing_v1(opts.base_url) else ""
        with sdk_errors(self, openai, openai.OpenAIError, not_found_hint=hint):
            resp = self.client().chat.completions.create(**kwargs)
        return self._read(resp)

    def _read(self, resp: object) -> Completion:
        from openai.types.chat import ChatCompletion

        if not isinstance(resp, ChatCompletion):
            raise TransientError(
                f"llm {self.name}: malformed reply ({type(resp).__name__}, not a chat completion)",
                kind="malformed",
            )
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise TransientError(f"llm {self.name}: reply has no choices", kind="malformed")
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None)
        if text is not None and not isinstance(text, str):
            raise TransientError(
                f"llm {self.name}: malformed reply content ({type(text).__name__})", kind="malformed"
            )
        usage = getattr(resp, "usage", None)
        finish = getattr(choice, "finish_reason", "") or ""
        if usage is None:  # some local servers leave usage out: the base class counts locally
            return Completion(text or "", 0, 0, finish, usage=False)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        return Completion(text or "", tokens_in, int(getattr(usage, "completion_tokens", 0) or 0), finish)


@hookimpl
def kf_register_llms(register: Register) -> None:
    register(
        "openai",
        OpenAIProvider,
        options=OpenAIOptions,
        description="OpenAI chat completions (or any OpenAI-compatible server via base_url)",
    )
