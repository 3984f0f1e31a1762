"""The tiny model's cache folder, shared by the whole test run."""

from __future__ import annotations

import os

import pytest


def shared_model_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One XDG cache folder for the tiny model, shared by every test process of the run.

    Under pytest-xdist each worker has its own base temporary folder; their common parent is the
    run's, so the workers (and the engine, chaos and acceptance tests) build the model once.
    Concurrent builders are safe: each builds in a folder of its own and renames it into place.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "model-cache"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)
