"""Finding a pipeline: a bundled example by name, or a user's ``module:attribute``.

The attribute may be a Pipeline or a zero-argument factory returning one (preferred: every
load gets a fresh pipeline object).
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import sys
import sysconfig

from tridentflow.errors import PipelineError, TridentflowError
from tridentflow.pipeline import Pipeline

EXAMPLES = {
    "wordcount": "tridentflow.examples.wordcount:wordcount",
    "wordcount-opaque": "tridentflow.examples.wordcount:wordcount_opaque",
    "partitioned-count": "tridentflow.examples.wordcount:partitioned_count",
    "wordcount-batched": "tridentflow.examples.wordcount:wordcount_batched",
    "user-scores": "tridentflow.examples.user_scores:user_scores",
    "wordcount-drpc": "tridentflow.examples.wordcount_drpc:wordcount_drpc",
    "mutating": "tridentflow.examples.mutating:mutating",
    "mutating-opaque": "tridentflow.examples.mutating:mutating_opaque",
    "wordcount-windowed": "tridentflow.examples.windowed:wordcount_windowed",
    "wordcount-stream": "tridentflow.examples.wordcount_stream:wordcount_stream",
    "wordcount-stream-tx": "tridentflow.examples.wordcount_stream:wordcount_stream_tx",
    "wordcount-postgres": "tridentflow.examples.wordcount_postgres:wordcount_postgres",
    "wordcount-delta": "tridentflow.examples.wordcount_delta:wordcount_delta",
    "wordcount-kafka": "tridentflow.examples.wordcount_kafka:wordcount_kafka",
    "wordcount-kafka-opaque": "tridentflow.examples.wordcount_kafka:wordcount_kafka_opaque",
    "wordcount-sqlite": "tridentflow.examples.sqlite_source:wordcount_sqlite",
    "wordcount-df": "tridentflow.examples.wordcount_df:wordcount_df",
    "wordcount-sql": "tridentflow.examples.wordcount_df:wordcount_sql",
}


def load_pipeline(ref: str) -> Pipeline:
    target = EXAMPLES.get(ref, ref)
    if ":" not in target:
        close = difflib.get_close_matches(ref, EXAMPLES, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise PipelineError(
            f"unknown pipeline {ref!r}: {hint}use a bundled example "
            f"({', '.join(sorted(EXAMPLES))}), module:attribute, or the name of a pipeline "
            "whose commits ran in this Redis (the CLI loads it from where they recorded it)"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _closest_module(module_name, attr) if _missing(exc, module_name) else ""
        raise PipelineError(f"pipeline {ref!r}: cannot import {module_name}: {exc}{hint}") from None
    except TridentflowError:
        raise
    except Exception as exc:  # the module's own code failed while it was imported
        raise PipelineError(
            f"pipeline {ref!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        close = difflib.get_close_matches(attr, [n for n in dir(module) if not n.startswith("_")])
        hint = f" (did you mean {module_name}:{close[0]}?)" if close else ""
        raise PipelineError(
            f"pipeline {ref!r}: {module_name} has no attribute {attr!r}{hint}"
        ) from None
    if callable(obj) and not isinstance(obj, Pipeline):
        try:
            obj = obj()
        except TridentflowError:
            raise
        except Exception as exc:  # the user's own code: one line naming where it failed
            raise PipelineError(
                f"pipeline {ref!r}: {target} raised {type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(obj, Pipeline):
        raise PipelineError(f"pipeline {ref!r} is a {type(obj).__name__}, not a Pipeline")
    obj.origin = {"ref": target, "path": _import_root(module, module_name)}
    return obj.validate()


def _import_root(module: object, module_name: str) -> str | None:
    """The folder that has to be on the path for ``module_name`` to import (the dags folder
    for a module beside a DAG); None for an installed module (importable anywhere)."""
    filename = getattr(module, "__file__", None)
    if not filename:
        return None
    root = os.path.dirname(os.path.abspath(filename))
    for _ in range(module_name.count(".") + (os.path.basename(filename) == "__init__.py")):
        root = os.path.dirname(root)
    installed = any(part in root for part in ("site-packages", "dist-packages"))
    return None if installed else root


def load_by_origin(origin: dict[str, str | None]) -> Pipeline:
    """The pipeline a recorded ``origin`` names (``Pipeline.origin``), its folder put on the
    path first (for good: a module imported later - a Spark job's - needs it too)."""
    path = origin.get("path")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    return load_pipeline(str(origin["ref"]))


def _missing(exc: ImportError, module_name: str) -> bool:
    """Whether ``exc`` says ``module_name`` itself (or its package) is not there - a typo -
    rather than an import the module's own code makes."""
    missing = getattr(exc, "name", None)
    return (
        isinstance(exc, ModuleNotFoundError)
        and missing is not None
        and (module_name == missing or module_name.startswith(f"{missing}."))
    )


def _closest_module(module_name: str, attr: str) -> str:
    """ " (did you mean 'NAME:ATTR'?)" for the module of the user's own folders (the path's
    directories outside the installed packages: the dags folder, the current one) closest to
    ``module_name``; "" if none is close. Read only on the error path."""
    stdlib = sysconfig.get_path("stdlib")
    folders = [
        p or os.getcwd()
        for p in sys.path
        if os.path.isdir(p or os.getcwd())
        and not any(part in p for part in ("site-packages", "dist-packages"))
        and not (p or os.getcwd()).startswith(stdlib)
    ]
    top, _, rest = module_name.partition(".")
    names = {m.name for m in pkgutil.iter_modules(folders)}
    close = difflib.get_close_matches(top, sorted(names), n=1, cutoff=0.75)
    if not close:
        return ""
    return f" (did you mean {'.'.join(filter(None, (close[0], rest)))}:{attr}?)"
