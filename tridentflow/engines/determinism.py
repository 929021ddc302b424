"""Whether Spark would compute a DataFrame's rows again the same: what a DataFrame step must
be to feed a transactional state (a replayed txid's keys must get the values its first attempt
staged). Decided from the analyzed plan itself, so the same on classic Spark and over Spark
Connect (which has no JVM handle): Spark's own non-deterministic expressions and the clock
functions it evaluates once per query, by name in the plan's text; Python UDFs declared
non-deterministic (classic: the JVM's ``deterministic``; Connect: the plan's protobuf); and
the plan shapes whose rows depend on the order Spark's tasks happen to deliver them: a
``limit`` without an order, ``sample``, and a round-robin ``repartition`` below an operation
that depends on order.

What cannot be decided is said in docs/model.md (Guarantees and their limits): a function
registered by name on a Connect server and called from SQL carries no determinism flag the
client can see."""

from __future__ import annotations

import re
from typing import Any

NONDETERMINISTIC_FUNCTIONS = (
    "rand",
    "randn",
    "random",
    "uniform",
    "randstr",
    "uuid",
    "shuffle",
    "monotonically_increasing_id",
    "spark_partition_id",
    "input_file_name",
    "input_file_block_start",
    "input_file_block_length",
    "current_timestamp",
    "current_date",
    "current_time",
    "localtimestamp",
    "now",
    "curdate",
    "first",
    "last",
    "first_value",
    "last_value",
    "any_value",
    "collect_list",
    "collect_set",
    "array_agg",
)
"""Spark functions whose value depends on chance, on the clock, on the task that runs them
or on the order rows arrive in (first, collect_list...), as the analyzed plan prints them."""

_CALL = re.compile(r"(?<![\w#`.])(" + "|".join(NONDETERMINISTIC_FUNCTIONS) + r")\(", re.I)
ORDER_DEPENDENT_NODES = frozenset({"GlobalLimit", "LocalLimit", "Tail", "Offset", "Sample"})
PASS_THROUGH = frozenset({"Project", "SubqueryAlias", "LocalLimit", "Filter", "WithCTE"})


def nondeterminism(df: Any) -> str | None:
    """Why ``df``'s rows could differ when Spark computes them again (a phrase naming the
    expression or operation), or None if its plan is deterministic."""
    text = analyzed_text(df)
    return _called(text) or _shape(text) or _udf(df)


def analyzed_text(df: Any) -> str:
    """The analyzed logical plan as Spark prints it (``explain(extended=True)``'s section)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # classic
        return str(jdf.queryExecution().analyzed().toString())
    text = df._explain_string(extended=True)
    section = text.split("== Analyzed Logical Plan ==", 1)[-1]
    return section.split("== Optimized Logical Plan ==", 1)[0]


def _called(text: str) -> str | None:
    for match in _CALL.finditer(text):
        close = _closing(text, match.end() - 1)
        if close is not None and text[close + 1 : close + 2] == "#":
            continue  # an attribute named after a call (rand(1)#5), not the call
        call = text[match.start() : (close + 1) if close is not None else match.end()]
        return f"{call[:80]} is non-deterministic"
    return None


def _closing(text: str, start: int) -> int | None:
    depth = 0
    for i in range(start, min(len(text), start + 2000)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def _tree(text: str) -> list[tuple[int, str, str]]:
    """(depth, node name, line) per line of a printed plan."""
    nodes = []
    for line in text.splitlines():
        body = line.lstrip(" :|+-")
        if not body or line.strip().startswith(("==", "\u2500")):
            continue
        name = re.match(r"[A-Za-z]+", body)
        if name is None:
            continue
        nodes.append(((len(line) - len(body)) // 3, name.group(0), body))
    return nodes


def _shape(text: str) -> str | None:
    nodes = _tree(text)
    for i, (_depth, name, line) in enumerate(nodes):
        if name == "Sample":
            return f"sample ({line.strip()[:60]}) is non-deterministic"
        if name in ("GlobalLimit", "Tail", "Offset"):
            below = _first_below(nodes, i)
            if below != "Sort":
                return (
                    f"a {name.lower().replace('global', '')} without an order (orderBy) is"
                    " non-deterministic"
                )
        if name == "Repartition" and line.rstrip().endswith("true"):  # round robin
            above = [n for d, n, _ in _ancestors(nodes, i)]
            if any(n in ORDER_DEPENDENT_NODES or n == "Window" for n in above):
                return (
                    "a repartition without keys (round robin) before an operation that "
                    "depends on row order is non-deterministic"
                )
    return None


def _first_below(nodes: list[tuple[int, str, str]], index: int) -> str | None:
    depth = nodes[index][0]
    for d, name, _line in nodes[index + 1 :]:
        if d <= depth:
            return None
        if name not in PASS_THROUGH:
            return name
        depth = d
    return None


def _ancestors(nodes: list[tuple[int, str, str]], index: int) -> list[tuple[int, str, str]]:
    found = []
    depth = nodes[index][0]
    for node in reversed(nodes[:index]):
        if node[0] < depth:
            found.append(node)
            depth = node[0]
    return found


def _udf(df: Any) -> str | None:
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        plan = jdf.queryExecution().analyzed()
        return None if plan.deterministic() else _jvm_offender(plan)
    proto = df._plan.to_proto(df.sparkSession.client)
    found = _proto_udf(proto)
    return None if found is None else f"the UDF {found} is declared non-deterministic"


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _jvm_offender(plan: Any) -> str:
    stack = [plan]
    while stack:
        node = stack.pop()
        for expression in _seq(node.expressions()):
            found = _jvm_expression(expression)
            if found is not None:
                return f"{found[:80]} is non-deterministic"
        stack.extend(_seq(node.children()))
    return "an expression Spark marks non-deterministic is in its plan"


def _jvm_expression(expression: Any) -> str | None:
    if expression.deterministic():
        return None
    for child in _seq(expression.children()):
        found = _jvm_expression(child)
        if found is not None:
            return found
    if expression.nodeName() == "PythonUDF":
        return f"the UDF {expression.name()} (declared non-deterministic)"
    return str(expression.sql())


def _proto_udf(message: Any) -> str | None:
    """The name of a non-deterministic inline UDF anywhere in a Connect plan protobuf."""
    if type(message).__name__ == "CommonInlineUserDefinedFunction" and not message.deterministic:
        return message.function_name or "<lambda>"
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if hasattr(value, "ListFields"):
            items = [value]
        elif hasattr(value, "values") and callable(value.values):
            items = [v for v in value.values() if hasattr(v, "ListFields")]
        else:
            items = list(value)
        for item in items:
            found = _proto_udf(item)
            if found is not None:
                return found
    return None
