"""Real models other people made, read from the registry wheels that ship them (the lock
installs them): a missing wheel or file fails the test that needs it, never skips it."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest


def packaged_model(distribution: str, inside: str, why: str,
                   sha256: str | None = None) -> Path:
    """The file ``inside`` the installed ``distribution``; ``why``: how it gets installed.
    With ``sha256``, the very file the tests were measured on."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"the {distribution} wheel is not installed: {why}")
    path = Path(str(dist.locate_file(inside)))
    assert path.is_file(), f"{path} is missing from {distribution} {dist.version}"
    if sha256 is not None:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256, \
            f"{distribution} {dist.version} ships another {Path(inside).name} than the " \
            "one measured"
    return path
