"""A user's pipeline module, shipped to where Spark runs Python: the spark-submit driver and its
executors, or a Spark Connect server's workers, must import the module a pipeline was loaded
from (its functions travel pickled by reference). A module installed in the environment
(site-packages) is there already; one that lives elsewhere - next to the DAG files in Airflow's
dags folder, in a project checkout - is not, and the emit would fail with "No module named
..." on every retry.

``shippable(ref)`` says what to ship for ``module:attribute``: the module's file, or a zip of
its top-level package (a namespace package too), with the directory it is imported from.
Idempotent and read-only but for the zip, written to a directory the caller owns.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tridentflow.errors import PipelineError
from tridentflow.registry import EXAMPLES


@dataclass(frozen=True)
class UserCode:
    """What holds a pipeline's module outside the installed packages: ``path`` (a ``.py``
    file, or a package directory) imported from ``root`` (a sys.path entry)."""

    module: str
    path: Path
    root: Path

    @property
    def is_package(self) -> bool:
        return self.path.is_dir()

    def archive(self, directory: Path) -> Path:
        """A file Spark can ship (``--py-files``, ``addArtifacts(pyfile=True)``): the module
        itself, or a zip of the package written into ``directory``."""
        if not self.is_package:
            return self.path
        target = Path(directory) / f"{self.path.name}.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
            for file in sorted(self.path.rglob("*.py")):
                if "__pycache__" not in file.parts:
                    zf.write(file, file.relative_to(self.root).as_posix())
        return target


def _installed_roots() -> list[Path]:
    """Where installed packages and the standard library live: shipping is never needed."""
    roots = set()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(Path(path).resolve())
    return sorted(roots)


def _distributed() -> set[str]:
    """Top-level modules that installed distributions provide."""
    return set(importlib.metadata.packages_distributions())


def shippable(ref: str) -> UserCode | None:
    """The user code to ship for pipeline ``ref`` (a bundled name or ``module:attribute``);
    None for a bundled example or a module installed in the environment. PipelineError (one
    line) if the module cannot be found from here."""
    target = EXAMPLES.get(ref, ref)
    if ref in EXAMPLES or ":" not in target:
        return None
    module = target.partition(":")[0]
    top = module.partition(".")[0]
    if top in _distributed():  # installed, editable installs included
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        raise PipelineError(f"pipeline {ref!r}: cannot find module {top}: {exc}") from None
    if spec is None:
        raise PipelineError(
            f"pipeline {ref!r}: no module named {top!r} where this worker imports from: put "
            "it in the dags folder next to the DAG file, or install it into Airflow's "
            "environment (docs/install.md, 'Your own pipeline')"
        )
    if spec.submodule_search_locations:  # a package (or a namespace package)
        path = Path(next(iter(spec.submodule_search_locations))).resolve()
    elif spec.origin and spec.origin not in ("built-in", "frozen"):
        path = Path(spec.origin).resolve()
    else:
        return None
    installed = _installed_roots()
    if any(path.is_relative_to(root) for root in installed):
        return None
    if path.suffix not in ("", ".py") and not path.is_dir():
        return None  # a compiled extension module: installed by other means
    return UserCode(module, path, path.parent)
