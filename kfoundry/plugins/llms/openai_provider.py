"""The ``openai`` provider: chat completions through the official SDK.

``base_url`` points it at any OpenAI-compatible server (vLLM, Ollama, llama.cpp server); such a
server's base URL ends in ``/v1``. The key comes from the environment variable named by
``api_key_env`` (default ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from kfoundry import hookimpl
from kfoundry.core.hookspecs import Register
from kfoundry.core.llm.cost import estimate_tokens
from kfoundry.core.llm.prompts import Prompt
from kfoundry.core.llm.provider import CallRefused, Completion, LLMError, LLMProvider, ProviderOptions
from kfoundry.core.llm.retry import TransientError, parse_retry_after

if TYPE_CHECKING:  # the SDK is imported where a call is made: importing it takes about half a second
    import openai

_RETRYABLE = {408, 409, 429}
_FATAL = {401, 403, 404}


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


def error_text(exc: Exception) -> str:
    """The server's own words from an SDK status error, on one line (no "Error code: NNN - " prefix)."""
    text = re.sub(r"^Error code: \d+ - ", "", str(getattr(exc, "message", "") or exc))
    return " ".join(text.split())[:300]


def retry_after(exc: Exception) -> float | None:
    """Seconds asked for by a ``retry-after-ms`` / ``retry-after`` header of an SDK error."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    ms = parse_retry_after(headers.get("retry-after-ms"))
    return ms / 1000 if ms is not None else parse_retry_after(headers.get("retry-after"))


class OpenAIProvider(LLMProvider):
    """Chat completions (OpenAI or any compatible server)."""

    provider = "openai"
    default_model = "gpt-5-mini"
    default_key_env = "OPENAI_API_KEY"

    def __init__(self, options: OpenAIOptions) -> None:
        super().__init__(options)
        self.options: OpenAIOptions = options
        self._client: openai.OpenAI | None = None

    def client(self) -> openai.OpenAI:
        import openai

        if self._client is None:
            self._client = openai.OpenAI(
                api_key=self.api_key(),
                base_url=self.options.base_url,
                timeout=self.options.timeout,
                max_retries=0,
            )
        return self._client

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
        import openai

        try:
            resp = self.client().chat.completions.create(**kwargs)
        except openai.APIStatusError as exc:
            status = exc.status_code
            what = f"llm {self.name}: HTTP {status}: {self.scrub(error_text(exc))}"
            if status in _RETRYABLE or status >= 500:
                raise TransientError(what, retry_after(exc)) from None
            if status in _FATAL:
                raise LLMError(what) from None
            raise CallRefused(what) from None
        except openai.APIConnectionError as exc:  # includes timeouts
            raise TransientError(f"llm {self.name}: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:  # a 200 whose body claims JSON but is not
            raise TransientError(f"llm {self.name}: malformed reply (not JSON: {exc})") from None
        return self._read(resp)

    def _read(self, resp: object) -> Completion:
        from openai.types.chat import ChatCompletion

        if not isinstance(resp, ChatCompletion):
            raise TransientError(
                f"llm {self.name}: malformed reply ({type(resp).__name__}, not a chat completion)"
            )
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise TransientError(f"llm {self.name}: reply has no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None)
        if text is not None and not isinstance(text, str):
            raise TransientError(f"llm {self.name}: malformed reply content ({type(text).__name__})")
        usage = getattr(resp, "usage", None)
        finish = getattr(choice, "finish_reason", "") or ""
        if usage is None:  # some local servers leave usage out: count conservatively
            return Completion(text or "", 0, estimate_tokens(text or ""), finish)
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
