"""Memory: winning branches, embedded and retrieved to prime later runs."""

from factory.memory._backends import (
    MEMORY_BACKENDS,
    create_memory_backend,
    memory_backend_names,
    register_memory_backend,
)
from factory.memory._embedders import (
    EMBEDDERS,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    create_embedder,
    embedder_names,
    register_embedder,
)
from factory.memory._lance import LanceMemoryBackend
from factory.memory._store import (
    DuckDBMemoryBackend,
    Memory,
    MemoryBackend,
    MemoryCandidate,
    RolloutMemoryStore,
    candidates_from_run,
    format_as_system_prompt,
)

__all__ = [
    "EMBEDDERS",
    "MEMORY_BACKENDS",
    "DuckDBMemoryBackend",
    "Embedder",
    "HashingEmbedder",
    "LanceMemoryBackend",
    "Memory",
    "MemoryBackend",
    "MemoryCandidate",
    "MiniLMEmbedder",
    "RolloutMemoryStore",
    "candidates_from_run",
    "create_embedder",
    "create_memory_backend",
    "embedder_names",
    "format_as_system_prompt",
    "memory_backend_names",
    "register_embedder",
    "register_memory_backend",
]
