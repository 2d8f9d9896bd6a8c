"""Where the testbed keeps things on a host. Read from the environment when called, never at import."""
from __future__ import annotations

import importlib.resources
import os
from pathlib import Path


def cache_dir() -> Path:
    """Built images; shared by runs, survives across clones (CI reuses it)."""
    return Path(os.environ.get("TESTBED_CACHE", "/var/cache/testbed"))


def state_dir() -> Path:
    """Per-run host state (overlays, seeds, console logs, run lock). Readable by libvirt's QEMU."""
    return Path(os.environ.get("TESTBED_STATE", "/var/lib/testbed"))


#: where libvirtd (through virtlogd) keeps each QEMU domain's log on its host; libvirt leaves
#: the file behind when the domain goes, so the testbed removes those of its own domains
QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")


#: `testbed --shared-host`, for this process and the runs it starts
SHARED_HOST_VAR = "TESTBED_SHARED_HOST"


def shared_host() -> bool:
    """Whether runs share this host with other shared runs (``TESTBED_SHARED_HOST=1``, set by
    ``--shared-host``) instead of holding it alone; the value is checked at the CLI's start."""
    return os.environ.get(SHARED_HOST_VAR, "0").strip() == "1"


def results_dir() -> Path:
    """Run output: `--results DIR` (which sets TESTBED_RESULTS for this process and its
    children) or ./results in the working directory. Never next to the package: an installed
    package lives in site-packages, which is no place for measurements."""
    return Path(os.environ.get("TESTBED_RESULTS") or Path.cwd() / "results").absolute()


def _data(name: str) -> Path:
    # Templates and image recipes stay top-level folders of the checkout; the package reaches
    # them through symlinks (testbed/_templates, testbed/_images) that a wheel turns into
    # package data, so a checkout, an editable install and `pip install .` read the same files.
    return Path(str(importlib.resources.files("testbed") / name))


def images_dir() -> Path:
    return _data("_images")


def templates_dir() -> Path:
    return _data("_templates")
