from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def image_store(settings: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Each test's own storage directory, so stored-once counts are this test's."""
    settings.RFT_STORAGE_DIR = tmp_path / "storage"  # type: ignore[attr-defined]
    return tmp_path / "storage" / "images"
