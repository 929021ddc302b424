"""Planted bugs for harnesses that run in a process of their own (the partition drill runs
under ``unshare -n``): each function plants one for the rest of the process's life, called
by name (``--plant tests.plants:NAME``)."""

from __future__ import annotations

import hashlib


def manifest_in_two_commands() -> None:
    """An emit attempt's manifest written, then its TTL set, in two commands (the fix of
    71359f4 undone): a manifest whose writer gave up on it may land without a TTL."""
    import tridentflow.steps.staging.in_redis as staging

    def store(client, keys, args):
        client.hset(keys[0], args[0], args[1])
        client.expire(keys[0], int(args[2]))
        return 1

    staging.STORE_MANIFEST = store


def block_before_its_index() -> None:
    """A staged block written, then added to its txid's index (``write_block``'s order
    reversed): cut between the two, the block is found by no cleanup until its TTL."""
    import tridentflow.steps.staging.in_redis as staging
    import tridentflow_state.staged as staged

    staged.write_block = staging.write_block = write_block_before_its_index


def write_block_before_its_index(pipe, space, shard, name, lines):
    """``state.staged.write_block`` with the block's SET queued before its index's SADD."""
    import tridentflow_state.staged as staged

    text = "\n".join(lines).encode("utf-8", "surrogatepass")
    ref = staged.BlockRef(shard, name, len(lines), hashlib.sha1(text).hexdigest())
    key, index = space.key(ref), space.index(shard)
    pipe.set(key, text, ex=staged.BLOCK_TTL_S)
    pipe.sadd(index, key)
    pipe.expire(index, staged.BLOCK_TTL_S)
    return ref
