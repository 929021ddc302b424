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


def test_the_acl_rules_grant_every_command_tridentflow_sends():
    """Every command a Lua script calls and every redis-py command method the code calls is
    in ``tridentflow.ops.acl``'s lists (a user holding exactly them runs every step)."""
    import redis

    from tridentflow.ops import acl

    granted = {c.split("|")[0] for c in acl.COMMANDS + acl.CLUSTER_COMMANDS + acl.STREAM_COMMANDS}
    named = {"delete": "del", "script_load": "script", "xinfo_groups": "xinfo",
             "xinfo_stream": "xinfo"}  # fmt: skip
    not_commands = {"pipeline", "close", "execute", "execute_command", "from_url", "lock"}
    sources = [*(ROOT / "state").rglob("*.py"), *(ROOT / "tridentflow").rglob("*.py")]
    sent: dict[str, str] = {}
    for path in sources:
        if "devtools" in path.parts:
            continue
        text = path.read_text()
        for command in re.findall(r"redis\.p?call\('([A-Za-z]+)'", text):
            sent.setdefault(command.lower(), str(path.relative_to(ROOT)))
        calls = r"(?:client|pipe|self\.client|rt\.client)\.([a-z_]+)\("
        for method in re.findall(calls, text):
            if hasattr(redis.Redis, method) and method not in not_commands:
                command = named.get(method, method.removesuffix("_iter"))
                sent.setdefault(command, str(path.relative_to(ROOT)))
    assert len(sent) > 30
    missing = {command: where for command, where in sent.items() if command not in granted}
    assert not missing, f"commands the ACL rules do not grant (and where they are sent): {missing}"
