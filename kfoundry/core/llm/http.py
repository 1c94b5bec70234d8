"""What the HTTP providers share: reading an SDK's errors, deciding what a failed request means
(retry, stop, or skip this call), reading a context-length refusal, and the client's settings.

The OpenAI and Anthropic SDKs have the same error classes (``APIStatusError``, ``APITimeoutError``,
``APIConnectionError``, a base error), so :func:`sdk_errors` maps either onto kfoundry's:
:class:`TransientError` (retried), :class:`LLMError` (stops the run) and :class:`CallRefused`
(this call fails, the run goes on).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kfoundry.core.llm.errors import CallRefused, LLMError
from kfoundry.core.llm.retry import TransientError, parse_retry_after

if TYPE_CHECKING:
    from kfoundry.core.llm.calls import ModelCaller

__all__ = [
    "FATAL_STATUS",
    "RETRYABLE_STATUS",
    "ContextRefusal",
    "client_settings",
    "connection_text",
    "context_refusal",
    "error_text",
    "retry_after",
    "sdk_errors",
]

#: Statuses worth retrying (besides every 5xx).
RETRYABLE_STATUS = frozenset({408, 409, 429})
#: Statuses that no retry and no other request can fix: a bad key, no access, no such model or URL.
FATAL_STATUS = frozenset({401, 403, 404})


def connection_text(exc: Exception) -> str:
    """An SDK connection error on one line, with the cause the SDK hides (refused, unknown host ...)."""
    cause = exc.__cause__ or exc.__context__
    text = f"{type(exc).__name__}: {exc}"
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {' '.join(str(cause).split())[:200]})"
    return text


def error_text(exc: Exception) -> str:
    """The server's own words from an SDK status error, on one line (no "Error code: NNN - " prefix)."""
    body = getattr(exc, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        text = err["message"]
    else:
        text = re.sub(r"^Error code: \d+ - ", "", str(getattr(exc, "message", "") or exc))
    return " ".join(text.split())[:300]


def retry_after(exc: Exception) -> float | None:
    """Seconds asked for by a ``retry-after-ms`` / ``retry-after`` header of an SDK error."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    ms = parse_retry_after(headers.get("retry-after-ms"))
    return ms / 1000 if ms is not None else parse_retry_after(headers.get("retry-after"))


def client_settings(caller: ModelCaller) -> dict[str, Any]:
    """The keyword arguments of an SDK client for ``caller`` (no SDK retries: kfoundry retries)."""
    return {
        "api_key": caller.api_key(),
        "base_url": caller.options.base_url,
        "timeout": caller.options.timeout,
        "max_retries": 0,
        "default_headers": caller.extra_headers() or None,
    }


@contextmanager
def sdk_errors(
    caller: ModelCaller, sdk: ModuleType, base_error: type[Exception], not_found_hint: str = ""
) -> Iterator[None]:
    """Raise what an SDK error raised inside means to kfoundry, on one scrubbed line.

    ``sdk`` is the SDK module (``openai``, ``anthropic``), ``base_error`` its root error class;
    ``not_found_hint`` is added to a 404 (a likely wrong base URL).
    """
    name = caller.name
    try:
        yield
    except sdk.APIStatusError as exc:
        status = exc.status_code
        what = f"llm {name}: HTTP {status}: {caller.scrub(error_text(exc))}"
        if status in RETRYABLE_STATUS or status >= 500:
            raise TransientError(what, retry_after(exc)) from None
        if status == 404 and not_found_hint:
            what += f" ({not_found_hint})"
        if status in FATAL_STATUS:
            raise LLMError(what) from None
        raise CallRefused(what) from None
    except sdk.APITimeoutError as exc:
        raise TransientError(f"llm {name}: {connection_text(exc)}", kind="timeout") from None
    except sdk.APIConnectionError as exc:
        raise TransientError(f"llm {name}: {connection_text(exc)}", kind="connection") from None
    except ValueError as exc:  # a 200 whose body claims JSON but is not
        raise TransientError(f"llm {name}: malformed reply (not JSON: {exc})", kind="malformed") from None
    except base_error as exc:  # anything else the SDK raises: one line, not a traceback
        raise LLMError(f"llm {name}: {caller.scrub(connection_text(exc))}") from None


#: Which server messages mean "prompt plus completion limit exceed the context window", and where
#: the numbers are: OpenAI and vLLM ("maximum context length is 8192 tokens ... (7000 in the
#: messages"), vLLM's newer wording ("your request has 7000 input tokens"), Anthropic ("input length
#: and `max_tokens` exceed context limit: 7000 + 8192 > 8192", "prompt is too long: 9000 tokens >
#: 8192 maximum"), llama.cpp ("exceeds the available context size", "n_ctx": 8192) and others.
_CONTEXT_HINTS = re.compile(
    r"context[ _-]?(length|window|size|limit)|maximum context|prompt is too long|too many tokens"
    r"|exceed_context_size|n_ctx|reduce the length",
    re.IGNORECASE,
)
_LIMIT = [
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),
    re.compile(r"context limit: *\d+ *\+ *\d+ *> *(\d+)", re.IGNORECASE),
    re.compile(r"tokens *> *(\d+) *maximum", re.IGNORECASE),
    re.compile(r"n_ctx\W+(\d+)", re.IGNORECASE),
    re.compile(r"context (?:length|window|size)(?: of| is|:)? *(\d+)", re.IGNORECASE),
]
_PROMPT = [
    re.compile(r"\((\d+) in the messages", re.IGNORECASE),
    re.compile(r"request has (\d+) input tokens", re.IGNORECASE),
    re.compile(r"context limit: *(\d+) *\+", re.IGNORECASE),
    re.compile(r"prompt is too long: *(\d+) tokens", re.IGNORECASE),
    re.compile(r"n_prompt_tokens\W+(\d+)", re.IGNORECASE),
]


@dataclass
class ContextRefusal:
    """What a context-length refusal said: the window and (if given) the prompt's tokens."""

    limit: int | None
    prompt_tokens: int | None


def context_refusal(message: str) -> ContextRefusal | None:
    """The numbers of a context-length refusal, or None if ``message`` is another kind of refusal."""
    text = message[:2000]
    if not _CONTEXT_HINTS.search(text):
        return None

    def first(patterns: list[re.Pattern[str]]) -> int | None:
        for pat in patterns:
            m = pat.search(text)
            if m:
                return int(m.group(1))
        return None

    return ContextRefusal(first(_LIMIT), first(_PROMPT))
