"""The least privilege tridentflow needs on Redis: ACL rules for one pipeline.

``COMMANDS`` is every Redis command tridentflow sends, from Python and from its Lua scripts
(Redis checks a script's commands against the caller's ACL too); a test runs every step as a
user holding exactly ``rules(...)`` and checks that nothing else was needed. The key pattern
covers one pipeline (``tf:{name}:*``, with the deployment's namespace if it has one) and
nothing else, so a user made for pipeline A cannot read or change pipeline B. No pub/sub
channels are granted.
"""

from __future__ import annotations

from collections.abc import Sequence

from tridentflow.errors import TridentflowError
from tridentflow_state.keys import KeySpace

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
    "hexists",  # where an emit attempt staged (a manifest in Redis, else files)
    "hset",
    "hsetnx",
    "hdel",  # the undo logs' range and a rewind's restores; change logs a sink applied
    "hkeys",
    "hmget",
    "hgetall",
    "hlen",
    "hscan",
    "hincrby",
    "sadd",
    "scard",
    "smembers",  # a replay's rollback of keys an earlier attempt wrote
    "sscan",  # staging in Redis: the blocks of an abandoned attempt, found in its txid's index
    "srem",
    "lpush",
    "rpush",  # a rewind rewrites the history without the rewound txids
    "ltrim",
    "lrange",
    "exists",
    "expire",  # staging in Redis: a txid's manifests expire with its blocks
    "unlink",  # undo logs past the retained range, freed in the background
    "time",
    # a commit with --wait-replicas / TRIDENTFLOW_WAIT_REPLICAS: WAIT after the mark
    "wait",
    # reset: finds a pipeline's keys by SCAN with its MATCH pattern
    "scan",
    # expiry (expire_after_txids): the index of per-txid buckets, merged from the written-sets
    # after a mark, forgotten and compacted
    "zadd",
    "zrem",
    "zrangebyscore",
    "spop",
    # exports: what each sink was allowed to apply, checked against its own store
    "zscore",
    # tridentflow evolve: a rename moves keys; a migration swaps a rewritten copy in
    "rename",
    "sismember",
    # tridentflow reshard: the expiry index's chunks split key by key into the new shards
    "zscan",
    # expiry in batch time (expire_after): each claim records its txid's batch time, searches
    # the sorted set of them for the horizon and thins what the running code no longer asks
    # for (the newest below the thinning's watermark: ZREVRANGEBYSCORE)
    "zcard",
    "zrange",
    "zremrangebyscore",
    "zrevrangebyscore",
    # a FileSource: its manifest of taken files (one list per partition: its length, ranges)
    "llen",
)


CLUSTER_COMMANDS = (
    "info",  # cluster mode is detected with INFO cluster (without it: a single server)
    "cluster|slots",  # the cluster client's slot map
    "command",  # the cluster client's key positions per command (COMMAND)
)
"""What a user needs in addition on a Redis Cluster (set on every node: ACLs are per node)."""


STREAM_COMMANDS = (
    "xadd",  # produce
    "xrange",  # every read
    "xinfo|stream",  # heads, and the checks against trimming and recreation
    "xtrim",  # trim
    "hkeys",  # the ordinal index: the nearest indexed ordinal, and trim
    "hdel",  # trim: index entries below the committed position
    "xgroup|create",  # each reader's consumer group (its registration on a shared stream)
    "xgroup|setid",  # the group follows the reader's committed entry
    "xgroup|destroy",  # a reset moves the group to where the reader starts again
    "xinfo|groups",  # the other readers: trim and reset --source respect them
    "xpending",  # a foreign group's oldest unacknowledged entry (trim keeps it)
    "xrevrange",  # a stream sink: the last entry it wrote
)
"""What a pipeline reading Redis Streams needs in addition."""


def rules(
    pipeline: str, namespace: str = "", cluster: bool = False, streams: Sequence[str] = ()
) -> str:
    """The ACL rules (for ``ACL SETUSER name on >password <rules>``) that let a user run one
    pipeline and nothing else (``cluster``: on a Redis Cluster; ``streams``: the keys of the
    Redis streams it reads)."""
    keys = KeySpace(pipeline, namespace)
    commands = (
        COMMANDS + (CLUSTER_COMMANDS if cluster else ()) + (STREAM_COMMANDS if streams else ())
    )
    return " ".join(
        ["resetkeys", f"~{keys.acl_pattern}", f"~{keys.shard_acl_pattern}"]
        + [f"~{stream}" for stream in streams]
        + ["resetchannels", "-@all"]
        + [f"+{command}" for command in commands]
    )


def setuser_line(
    pipeline: str,
    user: str,
    namespace: str = "",
    cluster: bool = False,
    streams: Sequence[str] = (),
) -> str:
    """The whole ``ACL SETUSER`` command, with a placeholder for the password. TridentflowError
    for a user name Redis would read otherwise (empty, or holding spaces or control
    characters: ``a b`` would set up user ``a``)."""
    if not user or any(c.isspace() or not c.isprintable() for c in user):
        raise TridentflowError(
            f"Redis user name {user!r} cannot be written in an ACL SETUSER line: use one "
            "word of printable characters, without spaces"
        )
    return f"ACL SETUSER {user} on >PASSWORD {rules(pipeline, namespace, cluster, streams)}"
