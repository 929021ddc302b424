"""Redis key layout.

Every key of a pipeline shares the hash tag ``{pipeline}`` so that the multi-key Lua scripts
stay legal on Redis Cluster (the ledger and everything fenced against it in one slot). With
``shards`` > 1, the map states are split into that many *state shards*, each under a hash tag
of its own (``{pipeline/I}``, chosen so the shards fall in evenly spaced slot ranges: on a
cluster whose slots are split evenly, consecutive shards sit on different masters). A shard
holds its part of every state, its written-sets, its own copy of the generation and a *fence*
hash that stands in, inside the shard's slot, for the ledger and tx hash the fenced scripts
check (see tridentflow_state.shards).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from itertools import count

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

MAX_SHARDS = 256

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"{kind} name {name!r} is invalid: use 1-128 of letters, digits, '_', '.', '-'"
            " (starting with a letter or digit)"
        )
    return name


@dataclass(frozen=True)
class KeySpace:
    """Names of all Redis keys that belong to one pipeline.

    ``namespace`` separates deployments that share one Redis database and use the same
    pipeline names (``tf:NAMESPACE:{pipeline}:...``); empty, keys are ``tf:{pipeline}:...``."""

    pipeline: str
    namespace: str = ""
    prefix: str = "tf"
    shards: int = 1
    """State shards (1: every state in the pipeline's own slot, fenced against the ledger)."""
    layout: int = 0
    """Which layout of ``shards`` the state shards' hash tags name: each ``tridentflow
    reshard`` moves the state to a new one, so the tags of two layouts never coincide and the
    state can be copied side by side (0: the first, ``pipeline/I``; L: ``pipeline/vL/I``)."""

    def __post_init__(self) -> None:
        check_name("pipeline", self.pipeline)
        if self.namespace:
            check_name("namespace", self.namespace)
        check_shards(self.shards)
        if not isinstance(self.layout, int) or self.layout < 0:
            raise ValueError(f"a shard layout is a whole number >= 0, got {self.layout!r}")

    @property
    def sharded(self) -> bool:
        return self.shards > 1

    def shard(self, index: int) -> KeySpace:
        """The keys of state shard ``index`` (this keyspace itself when unsharded)."""
        if not self.sharded:
            return self
        tag = shard_tags(self.pipeline, self.shards, self.layout)[index]
        return ShardSpace(self.pipeline, self.namespace, self.prefix, tag=tag)

    def shard_index(self, field: str) -> int:
        """The shard that holds ``field`` (an encoded key) in every state: stable across
        processes and machines (CRC-32 of its UTF-8 bytes)."""
        if not self.sharded:
            return 0
        return zlib.crc32(field.encode("utf-8", "surrogatepass")) % self.shards

    @property
    def shard_pattern(self) -> str:
        """SCAN pattern matching every key of every state shard of this pipeline."""
        return self.shard_acl_pattern.replace("{", "\\{")

    @property
    def shard_acl_pattern(self) -> str:
        """The ACL key pattern covering the state shards (names hold no '/' nor glob chars)."""
        return f"{self._head}{{{self.pipeline}/*"

    @property
    def _head(self) -> str:
        """What every key starts with before its hash tag: prefix and namespace."""
        return f"{self.prefix}:{self.namespace}:" if self.namespace else f"{self.prefix}:"

    @property
    def hash_tag(self) -> str:
        """What this keyspace's keys have between braces: the pipeline (a shard: its tag)."""
        return self.pipeline

    @property
    def base(self) -> str:
        return f"{self._head}{{{self.hash_tag}}}"

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of this pipeline (braces escaped for MATCH)."""
        return self.base.replace("{", "\\{").replace("}", "\\}") + ":*"

    @property
    def acl_pattern(self) -> str:
        """The ACL key pattern (``~...``) that covers every key of this pipeline and no other
        (braces are plain characters in ACL patterns; names cannot hold glob characters)."""
        return f"{self.base}:*"

    @property
    def ledger(self) -> str:
        return f"{self.base}:ledger"

    @property
    def generation(self) -> str:
        """The pipeline's current generation (a random token, replaced by every reset; the only
        key a reset keeps)."""
        return f"{self.base}:generation"

    @property
    def read_hold(self) -> str:
        """Set for a moment by a reader that kept missing a consistent view: the next commit
        waits for it (tridentflow_state.shards.query_state)."""
        return f"{self.base}:read-hold"

    @property
    def commit_waiting(self) -> str:
        """Set while a commit waits for a read hold: no new hold is taken before it begins."""
        return f"{self.base}:commit-waiting"

    @property
    def runs(self) -> str:
        return f"{self.base}:runs"

    @property
    def history(self) -> str:
        """List of the last commits' results, newest first (JSON objects)."""
        return f"{self.base}:history"

    @property
    def offsets(self) -> str:
        return f"{self.base}:offsets"

    @property
    def base_offsets(self) -> str:
        """Hash partition -> the offset this generation started reading at (set by a reset of
        a reader whose stream was trimmed before it; absent: 0). Audit recomputes from there."""
        return f"{self.base}:base-offsets"

    @property
    def quarantine(self) -> str:
        """Hash "partition:offset" -> JSON of a quarantined (bad) record."""
        return f"{self.base}:quarantine"

    def quarantine_written(self, txid: int) -> str:
        """Fields of the quarantine written by commit attempts of ``txid``."""
        return f"{self.base}:qwritten:{int(txid)}"

    def tx(self, txid: int) -> str:
        return f"{self.base}:tx:{int(txid)}"

    @property
    def batch_times(self) -> str:
        """Sorted set: the batch time each committed txid's metadata froze, scored by the
        txid (tridentflow_state.batch_times; only for a state with ``expire_after``)."""
        return f"{self.base}:batch-times"

    @property
    def batch_times_thinned(self) -> str:
        """The txid below which the batch times keep one txid an hour of batch time
        (tridentflow_state.batch_times: the thinning's watermark)."""
        return f"{self.base}:batch-times-thinned"

    def state(self, name: str) -> str:
        return f"{self.base}:state:{check_name('state', name)}"

    def changes(self, name: str, txid: int) -> str:
        """Hash of the keys txid changed in state ``name`` -> their stored value right after
        it (tridentflow_state.changes: the change log new-values streams and sinks read)."""
        return f"{self.base}:changes:{check_name('state', name)}:{int(txid)}"

    def change_counts(self, name: str) -> str:
        """Hash txid -> how many keys it changed in state ``name``: the seal of each complete
        change log (an absent field: no change log for that txid)."""
        return f"{self.base}:changelog:{check_name('state', name)}"

    @property
    def sinks(self) -> str:
        """Hash sink name -> JSON of its last exported txid (a mirror of what the sink itself
        records: status, metrics and the change log's retention read it)."""
        return f"{self.base}:sinks"

    @property
    def sink_attempts(self) -> str:
        """Hash ``SINK:TXID`` -> how many exports of that txid began (the ``mid-export`` fault
        point counts its attempts by it)."""
        return f"{self.sinks}:attempts"

    def sink_lock(self, sink: str) -> str:
        """String: the lease of the one exporter of ``sink`` (steps.export.LeasedLock)."""
        return f"{self.sinks}:lock:{sink}"

    def sink_versions(self, sink: str) -> str:
        """Hash txid -> the table version (Delta) or snapshot id (Iceberg) that holds it: a
        mirror of a lakehouse sink's stamps (rewind, status, vacuum's kept versions)."""
        return f"{self.sinks}:versions:{sink}"

    @property
    def sink_errors(self) -> str:
        """Hash sink name -> JSON of its last failed export ({error, txid, at_ms})."""
        return f"{self.sinks}:errors"

    def stream_index(self, partition: int) -> str:
        """Hash: a RedisStreamSource partition's ordinal -> entry ID index."""
        return f"{self.base}:stream-index:{int(partition)}"

    @property
    def reshard_copied(self) -> str:
        """Set: the old layout's keys a reshard copied whole so far."""
        return f"{self.base}:reshard-copied"

    def migrate_copy(self, name: str) -> str:
        """Where ``evolve --migrate`` builds the copy of one key of state ``name``."""
        return f"{self.base}:migrate-copy:{name}"

    def migrated(self, name: str) -> str:
        """Set: the keys of state ``name`` a migration has swapped in (its rerun skips them)."""
        return f"{self.base}:migrated:{name}"

    @property
    def sinks_reload(self) -> str:
        """Hash sink name -> why its next export reloads it from the whole state (an
        ``evolve --migrate`` rewrote the values it holds); deleted once it reloaded."""
        return f"{self.base}:sinks-reload"

    @property
    def sinks_allowed(self) -> str:
        """Sorted set sink name -> the highest txid it was allowed to apply, recorded before it
        applies (state.changes.allow_sink): a sink's own store past it proves Redis lost
        acknowledged writes since."""
        return f"{self.base}:sinks-allowed"

    @property
    def source_identity(self) -> str:
        """String: the identity of the source the reader reads (a Kafka topic's id), to tell
        a source deleted and created again under the same name."""
        return f"{self.base}:source-identity"

    @property
    def files_taken(self) -> str:
        """Hash path -> JSON {version, partition, ordinal} of every file a FileSource took
        (tridentflow.sources.files): a file listed again is compared with it, never with a
        time."""
        return f"{self.base}:files-taken"

    @property
    def files_meta(self) -> str:
        """Hash of a FileSource's bookkeeping: ``base:<partition>`` (the offset of its
        manifest's first entry, after a trim), and with ``forget_after`` ``frontier_ms`` (the
        newest mtime taken, capped at the Redis clock), ``watermark_ms`` (files modified
        before it are no longer compared: it only moves forward), ``forgotten`` (files
        forgotten so far) and ``below_watermark`` (files the last listing left below it)."""
        return f"{self.base}:files-meta"

    @property
    def files_forget(self) -> str:
        """Sorted set: path -> mtime in ms of every remembered file a FileSource with
        ``forget_after`` took, so the ones below the watermark are forgotten oldest first."""
        return f"{self.base}:files-forget"

    def files_manifest(self, partition: int) -> str:
        """List: the files a FileSource took into ``partition``, in the order taken; a
        file's offset is its index plus ``base:<partition>`` of files_meta (entries before
        it were trimmed; a txid's batch is a range of it: an explicit list)."""
        return f"{self.base}:files:{int(partition)}"

    def undo(self, name: str, txid: int) -> str:
        """Hash of the fields txid wrote in state ``name`` -> their stored value right before
        it ('' = absent), recorded with each write (state.undo: query as of an older txid,
        rewind)."""
        return f"{self.base}:undo:{check_name('state', name)}:{int(txid)}"

    @property
    def undo_meta(self) -> str:
        """Hash: what of the undo logs is retained (``from``: the oldest txid whose undo logs
        are complete; ``purged``: every txid below has none left; ``offsets:T``: the source
        offsets right after T) and ``rewinding`` (the target of a rewind under way)."""
        return f"{self.base}:undo-meta"

    @property
    def lineage(self) -> str:
        """String: the generation a pipeline's lineage began with, set by its first rewind
        (absent: the current generation). A reset starts a new lineage (it deletes the key);
        a rewind does not: a sink that cannot take back what it wrote (a Redis stream) goes
        on across a rewind, from its position."""
        return f"{self.base}:lineage"

    @property
    def rewinds(self) -> str:
        """List of the rewinds done, newest first (JSON: ``to``, ``committed``, ``last``,
        ``at_ms``): what marks a run's txid "rewound" in status and the view."""
        return f"{self.base}:rewinds"

    def expiry(self, name: str) -> str:
        """Sorted set: each live field of state ``name`` scored by the txid that last wrote it
        - the index expiry reads its candidates from (tridentflow_state.expiry; only for a
        state with ``expire_after_txids``)."""
        return f"{self.base}:expiry:{check_name('state', name)}"

    def expiry_built(self, name: str) -> str:
        """String, present while state ``name``'s expiry index (every shard's) is complete and
        followed: set by its build, deleted by every commit that does not keep it (expiry
        turned off), so turning expiry on again builds it anew (tridentflow_state.expiry)."""
        return f"{self.base}:expiry-built:{check_name('state', name)}"

    def written(self, name: str, txid: int) -> str:
        """Set of fields of state ``name`` written by any commit attempt of ``txid``."""
        return f"{self.base}:written:{check_name('state', name)}:{int(txid)}"

    def staged_manifests(self, generation: str, txid: int) -> str:
        """Hash emit attempt -> the JSON manifest of that attempt staged in Redis (written last;
        see tridentflow_state.staged). Under the generation: a reset's new pipeline never
        reads it."""
        return f"{self.base}:staged:{generation}:{int(txid)}"

    def staged_index(self, generation: str, txid: int) -> str:
        """Set: the key of every block any emit attempt of ``txid`` wrote in this keyspace's
        slot (its writer adds it with the block), so that an abandoned attempt's blocks - ones
        no manifest names - are found without a SCAN (tridentflow_state.staged)."""
        return f"{self.base}:staged:{generation}:{int(txid)}:blocks"

    def staged_block(self, generation: str, txid: int, attempt: int, block: str) -> str:
        """String: one block of staged ``key TAB partial`` lines of an emit attempt, in this
        keyspace's slot (a shard's blocks sit next to the shard's state)."""
        return f"{self.base}:block:{generation}:{int(txid)}:{int(attempt)}:{block}"


@dataclass(frozen=True)
class ShardSpace(KeySpace):
    """The keys of one state shard. Its fence hash stands for both the ledger and the tx hash
    in the fenced scripts: a claim (state.shards) writes there the ``committed`` txid and the
    ``commit_token`` the scripts check, inside the shard's own slot."""

    tag: str = ""

    @property
    def hash_tag(self) -> str:
        return self.tag

    @property
    def ledger(self) -> str:
        return self.fence

    def tx(self, txid: int) -> str:
        return self.fence

    @property
    def fence(self) -> str:
        return f"{self.base}:fence"


def check_shards(shards: int) -> int:
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(
            f"state shards must be a whole number from 1 to {MAX_SHARDS}, got {shards!r}"
        )
    return shards


@lru_cache(maxsize=64)
def shard_tags(pipeline: str, shards: int, layout: int = 0) -> tuple[str, ...]:
    """Hash tags of the shards: ``pipeline/I`` (or ``pipeline/I.K``, the first K whose slot
    falls in the I-th of ``shards`` equal slot ranges); in a later ``layout`` L,
    ``pipeline/vL/I`` (or ``pipeline/vL/I.K``)."""
    head = f"{pipeline}/" if layout == 0 else f"{pipeline}/v{layout}/"
    tags = []
    for index in range(shards):
        low = index * REDIS_CLUSTER_HASH_SLOTS // shards
        high = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // shards
        for k in count():
            tag = f"{head}{index}" if k == 0 else f"{head}{index}.{k}"
            if low <= key_slot(tag.encode()) < high:
                tags.append(tag)
                break
    return tuple(tags)
