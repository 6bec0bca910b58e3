"""Per-token prices for cost accounting.

A small table of list prices in USD per million tokens (input, output), as
published by the providers when this table was written; prices change, so
``FACTORY_PRICES`` (JSON: ``{"provider:model": [in, out]}``) overrides or
extends it. Unknown models cost ``None`` (unknown), never a guessed number;
local engines cost 0.
"""

from __future__ import annotations

import json
import os

from factory.errors import ConfigError

__all__ = ["PRICES_PER_MTOK", "cost_usd"]

PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "openai:gpt-4o": (2.50, 10.00),
    "openai:gpt-4o-mini": (0.15, 0.60),
    "openai:gpt-4.1": (2.00, 8.00),
    "openai:gpt-4.1-mini": (0.40, 1.60),
    "openai:gpt-4.1-nano": (0.10, 0.40),
    "anthropic:claude-3-5-haiku-latest": (0.80, 4.00),
    "anthropic:claude-3-5-sonnet-latest": (3.00, 15.00),
    "anthropic:claude-sonnet-4-0": (3.00, 15.00),
    "anthropic:claude-opus-4-0": (15.00, 75.00),
}


def _overrides() -> dict[str, tuple[float, float]]:
    text = os.environ.get("FACTORY_PRICES")
    if not text:
        return {}
    try:
        data = json.loads(text)
        return {str(k): (float(v[0]), float(v[1])) for k, v in data.items()}
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise ConfigError(f'FACTORY_PRICES must be JSON like {{"openai:gpt-4o": [2.5, 10]}}: {exc}') from exc


def cost_usd(provider: str, model: str, input_tokens: int, output_tokens: int) -> float | None:
    """Cost of a call, or None when the model's price is unknown."""
    if provider in ("local", "vllm", "hf", "replay"):
        return 0.0
    price = _overrides().get(f"{provider}:{model}") or PRICES_PER_MTOK.get(f"{provider}:{model}")
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000
