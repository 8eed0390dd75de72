"""Where the shared, read-only data sets live: ``<repo>/../shared/data``.

The repository root is the first directory above this file that holds ``pyproject.toml``. An
installed copy (site-packages) has none, so replay workloads also take an explicit ``path``.
"""

from __future__ import annotations

from pathlib import Path

from prefixroute.core import ConfigError


def shared_data_dir() -> Path:
    """``<repo>/../shared/data``; ConfigError when the repository root cannot be found."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file():
            return parent.parent / "shared" / "data"
    raise ConfigError(f"no pyproject.toml above {here}; give the data file as path=...")


def data_file(path: str, default: str) -> Path:
    """``path`` if given, else ``default`` under the shared data directory; it must exist."""
    file = Path(path).expanduser() if path else shared_data_dir() / default
    if not file.is_file():
        hint = "" if path else " (give the workload its file: --set path=FILE)"
        raise ConfigError(f"data file not found: {file}{hint}")
    return file
