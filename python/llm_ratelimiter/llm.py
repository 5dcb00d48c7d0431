"""The LLM helper: what one model call reserves and completes with.

The keys and the token bound are the Rust library's (``ratelimiter::llm``):
rpm 1, tpm the prompt's tokens plus ``max_tokens``, concurrency 1, and the
tenant's daily token budget when asked for. Pass the prompt's count by the
provider's tokenizer (``tokenizer=tiktoken.encoding_for_model(...)``): without
it the bound counts one token per prompt byte, safe but about four times what
English costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Protocol, Union

from . import _native
from .errors import ArgumentTypeError, InvalidArgumentError
from .limits import Actual, Requirement, profile_of

__all__ = ["LlmCall", "Tokenizer", "usage_tokens"]


class _Encoder(Protocol):
    def encode(self, text: str) -> Any: ...  # pragma: no cover


#: A tiktoken ``Encoding`` (anything with ``encode(text)`` returning tokens) or a
#: function that counts a text's tokens.
Tokenizer = Union[_Encoder, Callable[[str], int]]


def _count_tokens(tokenizer: Tokenizer, prompt: str) -> int:
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return len(encode(prompt))
    if callable(tokenizer):
        count = tokenizer(prompt)
        if not isinstance(count, int) or isinstance(count, bool):
            raise ArgumentTypeError("tokenizer(prompt) must return an int", field="tokenizer")
        return count
    raise ArgumentTypeError("tokenizer must have encode(text) or be callable", field="tokenizer")


@dataclass(frozen=True)
class LlmCall:
    """One model call, described by what decides its limits."""

    provider: str
    model: str
    tenant_id: str
    prompt: str
    max_tokens: int
    #: The prompt's token count by the provider's tokenizer; ``None`` counts bytes.
    prompt_tokens: Optional[int] = None
    #: Whether the tenant's daily token budget is reserved too.
    daily_budget: bool = False

    @classmethod
    def create(
        cls,
        provider: str,
        model: str,
        tenant_id: str,
        prompt: str,
        max_tokens: int,
        *,
        prompt_tokens: Optional[int] = None,
        tokenizer: Optional[Tokenizer] = None,
        daily_budget: bool = False,
    ) -> "LlmCall":
        """A call whose prompt is counted by ``tokenizer`` when given (and
        ``prompt_tokens`` is not)."""
        if prompt_tokens is None and tokenizer is not None:
            prompt_tokens = _count_tokens(tokenizer, prompt)
        call = cls(provider, model, tenant_id, prompt, max_tokens, prompt_tokens, daily_budget)
        call.requirements()  # Validates every field now, naming the bad one.
        return call

    def requirements(self) -> List[Requirement]:
        """What the call reserves, all or nothing."""
        for name in ("provider", "model", "tenant_id", "prompt"):
            if not isinstance(getattr(self, name), str):
                raise ArgumentTypeError(f"{name} must be a str", field=name)
        _check_count("max_tokens", self.max_tokens)
        if self.prompt_tokens is not None:
            _check_count("prompt_tokens", self.prompt_tokens)
        pairs = _native.llm_requirements(
            self.provider, self.model, self.tenant_id, self.prompt, self.max_tokens,
            prompt_tokens=self.prompt_tokens, daily_budget=self.daily_budget,
        )
        published = profile_of(self.provider, self.model)
        if published is not None:
            # The profile's rules, and the tenant's budget (the helper's last pair) when asked for.
            pairs = _native.profile_requirements(
                self.provider, self.model, published, self.prompt, self.max_tokens, prompt_tokens=self.prompt_tokens,
            ) + (pairs[-1:] if self.daily_budget else [])
        return [Requirement(key, amount) for key, amount in pairs]

    @property
    def token_upper_bound(self) -> int:
        """The tokens reserved on tpm: the most the call can use."""
        return self.requirements()[1].amount

    def actuals(self, used_tokens: int) -> List[Actual]:
        """What Complete reconciles once the call used ``used_tokens``."""
        _check_count("used_tokens", used_tokens)
        pairs = _native.llm_actuals(
            self.provider, self.model, self.tenant_id, used_tokens, daily_budget=self.daily_budget
        )
        published = profile_of(self.provider, self.model)
        if published is not None:
            pairs = _native.profile_actuals(
                self.provider, self.model, published, self.prompt, self.max_tokens, used_tokens,
                prompt_tokens=self.prompt_tokens,
            ) + (pairs[-1:] if self.daily_budget else [])
        return [Actual(key, amount) for key, amount in pairs]


def _check_count(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"{field} must be an int, got {type(value).__name__}", field=field)
    if value < 0:
        raise InvalidArgumentError(f"{field} must be at least 0, got {value}", field=field)


def usage_tokens(value: Any) -> int:
    """The tokens a provider charged, read from what its SDK returned.

    Accepts an ``int``; an OpenAI response or its ``usage`` (``total_tokens``,
    else ``prompt_tokens + completion_tokens``); an Anthropic ``usage``
    (``input_tokens + output_tokens``); or the same as plain mappings (the JSON).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    usage = _field(value, "usage")
    if usage is not None:
        return usage_tokens(usage)
    total = _field(value, "total_tokens")
    if isinstance(total, int):
        return total
    for prompt_name, output_name in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        prompt, output = _field(value, prompt_name), _field(value, output_name)
        if isinstance(prompt, int) and isinstance(output, int):
            return prompt + output
    raise ArgumentTypeError(
        f"cannot read token usage from {type(value).__name__}: expected an int, a response with usage, "
        "or usage with total_tokens / prompt_tokens+completion_tokens / input_tokens+output_tokens",
        field="usage",
    )


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    return getattr(value, name, None)
