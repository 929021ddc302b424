"""A user's pipeline module outside the installed packages is what the emit ships to Spark
(tridentflow.user_code): a module next to a DAG file as itself, a package as a zip of its
top level; bundled and installed modules are never shipped; a module that cannot be found is
one line saying where it must live."""

from __future__ import annotations

import sys
import zipfile

import pytest

from tridentflow.errors import PipelineError
from tridentflow.user_code import shippable


@pytest.fixture
def dags(tmp_path, monkeypatch):
    folder = tmp_path / "dags"
    (folder / "teamcounts").mkdir(parents=True)
    (folder / "my_counts_module.py").write_text("def build():\n    pass\n")
    (folder / "teamcounts" / "__init__.py").write_text("")
    (folder / "teamcounts" / "jobs.py").write_text("def build():\n    pass\n")
    (folder / "teamcounts" / "__pycache__").mkdir()
    (folder / "teamcounts" / "__pycache__" / "jobs.cpython-311.pyc").write_bytes(b"x")
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("my_counts_module", "teamcounts", "teamcounts.jobs"):
        sys.modules.pop(name, None)


def test_a_module_next_to_its_dag_ships_as_itself(dags, tmp_path):
    code = shippable("my_counts_module:build")
    assert code is not None and code.path == dags / "my_counts_module.py"
    assert code.archive(tmp_path) == dags / "my_counts_module.py"


def test_a_package_ships_as_a_zip_of_its_top_level(dags, tmp_path):
    code = shippable("teamcounts.jobs:build")
    assert code is not None and code.is_package
    with zipfile.ZipFile(code.archive(tmp_path)) as zf:
        assert sorted(zf.namelist()) == ["teamcounts/__init__.py", "teamcounts/jobs.py"]


@pytest.mark.parametrize(
    "ref", ["wordcount", "tridentflow.examples.wordcount:wordcount", "json:dumps", "redis:Redis"]
)
def test_bundled_standard_and_installed_modules_are_never_shipped(ref):
    assert shippable(ref) is None


def test_a_module_nowhere_to_be_found_says_where_it_must_live():
    with pytest.raises(PipelineError) as exc:
        shippable("no_such_counts_module:build")
    line = str(exc.value)
    assert "\n" not in line and "dags folder" in line and not exc.value.retry_helps
