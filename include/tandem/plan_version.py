"""A plan's version: what its YAML, its module and Tandem itself are now (issue 48 §1).

A running instance records the version it was launched with (``plan_instances.plan_version``, and beside its
checkpoints with the plan's shape, :mod:`tandem.plan_shape`); ``tandem status``, the REST API and the page show
it next to the version the files define now, so a pending change is visible before a relaunch carries it out.

The version is the start of a SHA-256 over Tandem's version, the plan's YAML and its module's source, each as
bytes: an edit of a comment is a new version (it is cheap to say "code only" about it: ``tandem plan diff``).
Finding the module's file imports nothing of it (no pyspark): the status and the supervisor compute versions too.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from tandem import __version__
from tandem.config import PlanConfig

VERSION_LENGTH = 12
"""Hex digits of a version: enough that two versions of one plan never collide in practice, short to read."""


def plan_module_file(plan: PlanConfig) -> Path:
    """A project's own plan module: ``<name>.py`` beside the plan's YAML (it may not exist)."""
    return plan.path.with_suffix(".py")


def module_source(plan: PlanConfig) -> bytes | None:
    """The source of the plan's module: the file beside its YAML when there is one, else the file of ``module:``
    found along its package's path (in a folder or a zip) without importing it; ``None`` when there is none (the
    launch says why)."""
    beside = plan_module_file(plan)
    if beside.is_file():
        return beside.read_bytes()
    top, *rest = plan.module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_data"):
        return None
    candidates = [spec.origin] if not rest else [
        str(path) for folder in spec.submodule_search_locations or ()
        for path in (Path(folder).joinpath(*rest).with_suffix(".py"), Path(folder).joinpath(*rest, "__init__.py"))]
    for candidate in candidates:
        try:
            return spec.loader.get_data(candidate)
        except OSError:
            continue
    return None


def plan_version(plan: PlanConfig) -> str:
    """The plan's version now (see the module's docs)."""
    digest = hashlib.sha256(f"tandem {__version__}\n".encode())
    for content in (plan.path.read_bytes() if plan.path.is_file() else b"", module_source(plan) or b""):
        digest.update(len(content).to_bytes(8, "big"))
        digest.update(content)
    return digest.hexdigest()[:VERSION_LENGTH]
