"""The cluster and plans for the presenter's requests, parsed again only when a configuration file changes.

Parsing ``cluster.yaml`` and every plan takes tens of milliseconds of pure-Python YAML; a request
of every open page did it, which at 20 pages is most of a core beside the plan instances. Here the
parsed configuration is kept while the files under ``conf/`` (their paths, sizes and modification
times) and the environment that overrides them stay the same, looked at once a second at most.

A plan file that does not load is kept apart with its error (:func:`broken`): the other plans are
served as usual, and the page lists the broken one with its error.
"""

from __future__ import annotations

import os
from pathlib import Path

from tandem.config import ClusterConfig, PlanConfig, conf_dir, load_cluster, load_plans_and_errors, plans_dir
from tandem.errors import ConfigError
from tandem.presenter.cache import VersionedCache

OVERRIDES = ("TANDEM_CONF_DIR", "TANDEM_HOME", "TANDEM_STORAGE_ROOT", "TANDEM_DATABASE_URL", "TANDEM_AIRFLOW_URL",
             "TANDEM_PLANS_DIR")
"""The environment variables the configuration reads besides its files."""
Configuration = tuple[ClusterConfig, dict[str, PlanConfig]]
Parsed = tuple[ClusterConfig, dict[str, PlanConfig], dict[str, ConfigError]]
_PARSED: VersionedCache[Parsed] = VersionedCache(ttl_s=1.0, max_entries=8)


def _files_and_environment() -> tuple:
    folder = conf_dir()
    files = [folder / "cluster.yaml", *sorted(plans_dir(folder).glob("*.yaml"))]
    return tuple(os.environ.get(name) for name in OVERRIDES), tuple(_stat(path) for path in files)


def _stat(path: Path) -> tuple[str, int, int] | tuple[str]:
    try:
        status = path.stat()
    except FileNotFoundError:
        return (str(path),)
    return str(path), status.st_mtime_ns, status.st_size


def _parse(_version: object) -> Parsed:
    cluster = load_cluster()
    return cluster, *load_plans_and_errors(cluster)


def _parsed() -> Parsed:
    return _PARSED.get(tuple(os.environ.get(name) for name in OVERRIDES), _files_and_environment, _parse)


def current() -> Configuration:
    """The cluster and every plan that loads, as ``load_cluster()`` and ``load_plans_and_errors()`` would
    return them now."""
    cluster, plans, _ = _parsed()
    return cluster, plans


def broken() -> dict[str, ConfigError]:
    """Each plan file that does not load now, by file name without ``.yaml``: its error."""
    return _parsed()[2]
