"""textkit: small text utilities."""

from textkit.slug import slugify
from textkit.wrap import truncate, wrap

__all__ = ["slugify", "truncate", "wrap"]
__version__ = "0.3.0"
