"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A compile cache of the test's own, empty in memory and on disk."""
    from explorer import compiler

    monkeypatch.setenv("SCANWEAVER_CACHE", str(tmp_path / "cache"))
    compiler._MEMORY.clear()
    yield
    compiler.wait_for_cache_writes()
    compiler._MEMORY.clear()
