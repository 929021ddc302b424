"""The word count over Redis Streams (issue 13): sentences XADDed to the streams
``tridentflow:wordcount-stream:p0`` .. ``p3`` (field ``sentence``) - by ``tridentflow produce
wordcount-stream FILE`` (round robin) or by any producer - counted into an opaque state.

The source is opaque: a stream that is missing or unreadable is skipped for a txid and caught
up later, like a dark partition. ``wordcount-stream-tx`` reads the same kind of streams
transactionally (each txid's ID ranges frozen in its batch metadata)."""

from __future__ import annotations

from tridentflow.examples.wordcount import wordcount_over
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import RedisStreamSource, SourceMode


def _wordcount_stream(name: str, mode: SourceMode) -> Pipeline:
    source = RedisStreamSource(fields=("sentence",), mode=mode, partitions=4, batch_size=1000)
    return wordcount_over(name, source, f"word count over {mode.value} Redis Streams")


def wordcount_stream() -> Pipeline:
    return _wordcount_stream("wordcount-stream", SourceMode.OPAQUE)


def wordcount_stream_tx() -> Pipeline:
    return _wordcount_stream("wordcount-stream-tx", SourceMode.TRANSACTIONAL)
