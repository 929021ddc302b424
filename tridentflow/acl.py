"""The least privilege tridentflow needs on Redis: ACL rules for one pipeline.

``COMMANDS`` is every Redis command tridentflow sends, from Python and from its Lua scripts
(Redis checks a script's commands against the caller's ACL too); a test runs every step as a
user holding exactly ``rules(...)`` and checks that nothing else was needed. The key pattern
covers one pipeline (``tf:{name}:*``, with the deployment's namespace if it has one) and
nothing else, so a user made for pipeline A cannot read or change pipeline B. No pub/sub
channels are granted.
"""

from __future__ import annotations

from state.keys import KeySpace

COMMANDS = (
    # connection: redis-py's handshake (HELLO) and checks (PING; SELECT for a db other than 0)
    "hello",
    "ping",
    "select",
    # scripts: every fenced write is a Lua script run by EVALSHA (SCRIPT LOAD after NOSCRIPT)
    "evalsha",
    "script|load",
    # reads and writes, from Python and from inside the scripts
    "get",
    "set",
    "del",
    "hget",
    "hset",
    "hsetnx",
    "hmget",
    "hgetall",
    "hlen",
    "hscan",
    "hincrby",
    "sadd",
    "scard",
    "smembers",  # a replay's rollback of keys an earlier attempt wrote
    "lpush",
    "ltrim",
    "lrange",
    "time",
    # a commit with --wait-replicas / TRIDENTFLOW_WAIT_REPLICAS: WAIT after the mark
    "wait",
    # reset: finds a pipeline's keys by SCAN with its MATCH pattern
    "scan",
)


def rules(pipeline: str, namespace: str = "") -> str:
    """The ACL rules (for ``ACL SETUSER name on >password <rules>``) that let a user run one
    pipeline and nothing else."""
    keys = KeySpace(pipeline, namespace)
    return " ".join(
        ["resetkeys", f"~{keys.acl_pattern}", "resetchannels", "-@all"]
        + [f"+{command}" for command in COMMANDS]
    )


def setuser_line(pipeline: str, user: str, namespace: str = "") -> str:
    """The whole ``ACL SETUSER`` command, with a placeholder for the password."""
    return f"ACL SETUSER {user} on >PASSWORD {rules(pipeline, namespace)}"
