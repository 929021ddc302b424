"""Planted bugs for harnesses that run in a process of their own (the partition drill runs
under ``unshare -n``): each function plants one for the rest of the process's life, called
by name (``--plant tests.plants:NAME``)."""

from __future__ import annotations


def manifest_in_two_commands() -> None:
    """An emit attempt's manifest written, then its TTL set, in two commands (the fix of
    71359f4 undone): a manifest whose writer gave up on it may land without a TTL."""
    import tridentflow.steps.staging as staging

    def store(client, keys, args):
        client.hset(keys[0], args[0], args[1])
        client.expire(keys[0], int(args[2]))
        return 1

    staging.STORE_MANIFEST = store
