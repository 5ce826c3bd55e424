from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def image_store(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Each test's own storage directory, so stored-once counts are this test's. Browser
    tests keep the configured one: the live server (another process) serves from it."""
    from django.conf import settings

    if request.node.get_closest_marker("browser"):
        return Path(settings.RFT_STORAGE_DIR) / "images"
    override = request.getfixturevalue("settings")
    override.RFT_STORAGE_DIR = tmp_path / "storage"
    return tmp_path / "storage" / "images"
