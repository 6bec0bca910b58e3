"""Fixtures of the verifier tests."""

from __future__ import annotations

import pytest

from tests import _verify_loop


@pytest.fixture(autouse=True, scope="module")
def _verifications_share_one_loop_per_module():
    """Close the module's shared verification loop (:mod:`tests._verify_loop`) and its warm runners after it."""
    yield
    _verify_loop.close()
