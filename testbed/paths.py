"""Where the testbed keeps things on a host. Read from the environment when called, never at import."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Built images; shared by runs, survives across clones (CI reuses it)."""
    return Path(os.environ.get("TESTBED_CACHE", "/var/cache/testbed"))


def state_dir() -> Path:
    """Per-run host state (overlays, seeds, console logs, run lock). Readable by libvirt's QEMU."""
    return Path(os.environ.get("TESTBED_STATE", "/var/lib/testbed"))


def results_dir() -> Path:
    return Path(os.environ.get("TESTBED_RESULTS", REPO / "results"))


def images_dir() -> Path:
    return REPO / "images"


def templates_dir() -> Path:
    return REPO / "templates"
