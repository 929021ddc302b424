"""Staging in files under the home (``TRIDENTFLOW_STAGING=files``: emit and commit must share
the home); the driver writes everything.

    {root}/tx-000000000007/attempt-2/state-counts.tsv   encoded key TAB partial (JSON), per line
    {root}/tx-000000000007/attempt-2/bad.jsonl          records to quarantine, one per line
    {root}/tx-000000000007/attempt-2/MANIFEST.json      written last, atomically

For each state file and the bad records the manifest holds the line count and SHA-256, which
``load`` checks. Manifests without ``"format": "tsv"`` (from before) name ``[key, partial]``
JSON lines, still read (``_json_pair_lines``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tridentflow.engines.base import staged_json
from tridentflow.errors import IncompleteBatchError
from tridentflow.fileio import fsync_dir, write_atomic
from tridentflow.plan import BadRecord
from tridentflow.steps.staging.base import (
    Partials,
    StagedBatch,
    StagingArea,
    check_manifest_names,
    parse_manifest,
)
from tridentflow_state.staged import WrittenBlocks

MANIFEST = "MANIFEST.json"
BAD_FILE = "bad.jsonl"
STAGING_ENV = "TRIDENTFLOW_STAGING"
"""Where emits stage their output: ``redis`` (the default: next to each state shard, any two
hosts that reach Redis) or ``files`` (under the home, which emit and commit must share)."""


def _write_state(path: Path, pairs: Iterable[tuple[str, Any]], what: str) -> dict[str, Any]:
    """Write ``key TAB value`` lines, fsync; return {file, lines, sha256, format}."""
    info = _write_lines(path, (f"{key}\t{staged_json(v, what)}" for key, v in pairs))
    info["format"] = "tsv"
    return info


def _write_lines(path: Path, texts: Iterable[str]) -> dict[str, Any]:
    """Write one text per line, fsync; return {file, lines, sha256}."""
    digest, lines = hashlib.sha256(), 0
    with open(path, "wb") as fh:
        for text in texts:
            line = text.encode() + b"\n"
            fh.write(line)
            digest.update(line)
            lines += 1
        fh.flush()
        os.fsync(fh.fileno())
    return {"file": path.name, "lines": lines, "sha256": digest.hexdigest()}


def _verify_lines(directory: Path, info: dict[str, Any], what: str) -> None:
    digest, lines = hashlib.sha256(), 0
    try:
        with open(directory / info["file"], "rb") as fh:
            for line in fh:
                digest.update(line)
                lines += 1
    except FileNotFoundError:
        raise IncompleteBatchError(f"{directory}: staged file for {what} is missing") from None
    if lines != info["lines"] or digest.hexdigest() != info["sha256"]:
        raise IncompleteBatchError(
            f"{directory}: staged file for {what} has {lines} lines (manifest: "
            f"{info['lines']}) or a different checksum"
        )


def _json_pair_lines(fh: TextIO) -> Iterator[str]:
    """Lines staged before the tsv format (``[key, partial]`` JSON), as tsv lines."""
    for line in fh:
        key, partial = json.loads(line)
        yield f"{key}\t{json.dumps(partial, ensure_ascii=False)}\n"


class FileStagedBatch(StagedBatch):
    """A batch staged in files: ``directory`` holds the manifest and what it names."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory = directory
        self.manifest = manifest

    @property
    def place(self) -> str:
        return str(self.directory)

    @property
    def staged_in(self) -> str:
        return "files"

    def lines(self, state: str) -> Iterator[str]:
        info = self.state_info(state)
        with self._open(info["file"]) as fh:
            yield from fh if info.get("format") == "tsv" else _json_pair_lines(fh)

    def bad_records(self) -> Iterator[dict[str, Any]]:
        info = self.manifest.get("bad")
        if not info:
            return
        with self._open(info["file"]) as fh:
            for line in fh:
                yield json.loads(line)

    def _open(self, name: str) -> TextIO:
        """A staged file, to read; IncompleteBatchError (one line) if it is gone - the txid
        committed meanwhile and its staging was deleted, or someone deleted it - so the step
        fails as any step does and its retry finds what happened."""
        try:
            return open(self.directory / name, encoding="utf-8")
        except FileNotFoundError:
            raise IncompleteBatchError(
                f"txid {self.txid} attempt {self.attempt}: staged file {name} is gone "
                "(the txid committed meanwhile, or its staging was deleted): retry the commit; "
                "if the txid is not committed, emit it again"
            ) from None


class FileStagingArea(StagingArea):
    """A ``StagingArea`` in a directory: one per txid, one below it per attempt."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def tx_dir(self, txid: int) -> Path:
        return self.root / f"tx-{txid:012d}"

    def attempt_dir(self, txid: int, attempt: int) -> Path:
        return self.tx_dir(txid) / f"attempt-{attempt}"

    def space(self, txid: int, attempt: int) -> None:
        """Nowhere for executors: files are written by the driver."""
        return None

    def _stage(
        self, txid: int, attempt: int, partials: Partials, bad: Iterable[BadRecord]
    ) -> dict[str, Any]:
        """The attempt's directory anew: a file per state, the bad records' file, fsynced."""
        directory = self.attempt_dir(txid, attempt)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        states = {}
        for name, pairs in partials.items():
            if isinstance(pairs, WrittenBlocks):
                raise TypeError(f"state {name}: blocks cannot be staged in files")
            states[name] = _write_state(directory / f"state-{name}.tsv", pairs, f"state {name}")
        bad_info = _write_lines(
            directory / BAD_FILE, (staged_json(b.to_json(), "value") for b in bad)
        )
        fsync_dir(directory)
        return {"states": states, "bad": bad_info}

    def _store_manifest(self, txid: int, attempt: int, manifest: dict[str, Any]) -> FileStagedBatch:
        """The manifest file, written atomically."""
        directory = self.attempt_dir(txid, attempt)
        write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        return FileStagedBatch(directory, manifest)

    def load(self, txid: int, attempt: int) -> FileStagedBatch:
        """Load and verify a staged attempt (each file's lines and SHA-256)."""
        directory = self.attempt_dir(txid, attempt)
        manifest = self.manifest(txid, attempt)
        for name, info in manifest["states"].items():
            _verify_lines(directory, info, f"state {name}")
        if "bad" in manifest:
            _verify_lines(directory, manifest["bad"], "bad records")
        batch = FileStagedBatch(directory, manifest)
        batch.check_complete()
        return batch

    def manifest(self, txid: int, attempt: int) -> dict[str, Any]:
        directory = self.attempt_dir(txid, attempt)
        try:
            raw = (directory / MANIFEST).read_text()
        except FileNotFoundError:
            raise IncompleteBatchError(
                f"txid {txid} attempt {attempt}: no staged manifest in {directory} - if its "
                "emit ran on another host, share TRIDENTFLOW_HOME between emit and commit or "
                f"set {STAGING_ENV}=redis for both, then emit again"
            ) from None
        manifest = parse_manifest(raw, txid)
        check_manifest_names(manifest, txid, attempt, str(directory))
        return manifest

    def holds(self, txid: int, attempt: int) -> bool:
        return (self.attempt_dir(txid, attempt) / MANIFEST).exists()

    def discard(self, txid: int) -> None:
        shutil.rmtree(self.tx_dir(txid), ignore_errors=True)

    def discard_before(self, txid: int) -> None:
        """Every staged txid below ``txid``, however many in a row: one directory listing."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                number = entry.name.removeprefix("tx-")
                if entry.name.startswith("tx-") and number.isdigit() and int(number) < txid:
                    shutil.rmtree(entry.path, ignore_errors=True)

    def discard_attempts(self, txid: int, attempts: Iterable[int]) -> None:
        """The named attempts' directories, and the txid's once it is empty."""
        for attempt in attempts:
            shutil.rmtree(self.attempt_dir(txid, attempt), ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty (another attempt), or gone
            self.tx_dir(txid).rmdir()

    def prune(self, batch: StagedBatch) -> None:
        """Nothing to do: an attempt's directory holds only what its manifest names."""
