"""Benchmark: appending to the source log (issue 10: produce at >= 500k records/s).

    python benchmarks/produce.py [--records 1000000] [--repeat 3]

Writes --records Zipf sentences of 8 words (the vs_spark data) to a file, then times
``tridentflow produce wordcount FILE`` as a whole process (its imports included) into a fresh
home, best of --repeat, and reports records/s; every run's log is read back and checked.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import accumulate
from pathlib import Path

from tridentflow.sources.filelog import FileLog

VOCABULARY = 50_000


def generate(records: int, seed: int = 1) -> list[str]:
    """Zipf sentences of 8 words from a VOCABULARY-word vocabulary (as benchmarks/vs_spark)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(VOCABULARY)]
    cumulative = list(accumulate(1 / (i + 1) for i in range(VOCABULARY)))
    return [" ".join(rng.choices(words, cum_weights=cumulative, k=8)) for _ in range(records)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tridentflow-bench-produce-"))
    try:
        source = work / "sentences.txt"
        lines = generate(args.records)
        source.write_text("\n".join(lines) + "\n")
        tridentflow = Path(sys.executable).with_name("tridentflow")
        best = float("inf")
        for rep in range(args.repeat):
            home = work / f"home-{rep}"
            env = dict(os.environ, TRIDENTFLOW_HOME=str(home))
            started = time.monotonic()
            subprocess.run([str(tridentflow), "produce", "wordcount", str(source)],
                           check=True, env=env, capture_output=True)  # fmt: skip
            elapsed = time.monotonic() - started
            best = min(best, elapsed)
            log = FileLog(home / "sources" / "wordcount")
            heads = log.heads()
            assert sum(heads.values()) == args.records
            assert [r for _o, r in log.read(0, 0, 3)] == lines[0:12:4][:3]
            print(f"  rep {rep + 1}: {elapsed:.2f}s ({args.records / elapsed:,.0f} records/s)")
        print(f"produce {args.records:,} records: best {best:.2f}s = "
              f"{args.records / best:,.0f} records/s (whole process)")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
