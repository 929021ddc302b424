"""Hand-written inventories match what they list: the CLI's commands in its module docstring
and in docs/operations.md against the real parser; the state package's docstring names
modules that exist. (The view's routes: tests/airflow/test_view_inventory.py.)"""

from __future__ import annotations

import argparse
import re

import tridentflow.ops.cli as cli
import tridentflow_state
from tests.conftest import ROOT


def _commands() -> set[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def _named(text: str) -> set[str]:
    return set(re.findall(r"^\s*tridentflow ([a-z][a-z-]*)", text, flags=re.M))


def test_the_clis_docstring_lists_every_command_and_no_other():
    assert _named(cli.__doc__ or "") == _commands()


def test_the_operations_page_lists_every_command_and_no_other():
    page = (ROOT / "docs" / "operations.md").read_text()
    block = page[page.index("## CLI") :]
    block = block[block.index("```") + 3 :]
    assert _named(block[: block.index("```")]) == _commands()


def test_the_state_package_names_modules_that_exist():
    named = set(re.findall(r"``([a-z_]+)``", tridentflow_state.__doc__ or ""))
    assert named, "the docstring names its modules"
    for module in named:
        assert (ROOT / "state" / f"{module}.py").exists(), module
