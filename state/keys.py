"""Redis key layout. Every key of a pipeline shares the hash tag ``{pipeline}`` so that the
multi-key Lua scripts stay legal on Redis Cluster (all keys of one pipeline in one slot)."""

from __future__ import annotations

import re
from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        check_name("pipeline", self.pipeline)
        if self.namespace:
            check_name("namespace", self.namespace)

    @property
    def base(self) -> str:
        ns = f"{self.namespace}:" if self.namespace else ""
        return f"{self.prefix}:{ns}{{{self.pipeline}}}"

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
    def quarantine(self) -> str:
        """Hash "partition:offset" -> JSON of a quarantined (bad) record."""
        return f"{self.base}:quarantine"

    def quarantine_written(self, txid: int) -> str:
        """Fields of the quarantine written by commit attempts of ``txid``."""
        return f"{self.base}:qwritten:{int(txid)}"

    def tx(self, txid: int) -> str:
        return f"{self.base}:tx:{int(txid)}"

    def state(self, name: str) -> str:
        return f"{self.base}:state:{check_name('state', name)}"

    def written(self, name: str, txid: int) -> str:
        """Set of fields of state ``name`` written by any commit attempt of ``txid``."""
        return f"{self.base}:written:{check_name('state', name)}:{int(txid)}"
