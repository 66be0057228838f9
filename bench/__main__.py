"""What can be measured, by the question it answers: `python -m bench --list` shows the
suites, `python -m bench <suite> [options]` runs one (its own `--help` lists the options) and
writes its result to bench/results/ with the machine it ran on. The docs render their figures
from those results (docs/performance.md)."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    question: str
    module: str
    needs: str = ""  # what the machine needs beyond `make install-test`


SUITES = {
    "deletion-latency": Suite(
        "How long from a deletion's POST to its certificate, and how many deletions a second?",
        "bench.update_path",
        "PostgreSQL and Redis (distributed part)",
    ),
    "pipeline": Suite(
        "How many deletions a second, distributed and embedded, and at what latency?",
        "bench.pipeline",
        "PostgreSQL and Redis",
    ),
    "shard-pool": Suite(
        "How much faster does a sharded model's deletion run with 2 workers than with 1?",
        "bench.shard_pool",
        "PostgreSQL and Redis",
    ),
    "registration": Suite(
        "How fast is a million-row upload registered, and in how much memory?",
        "bench.registration",
        "SeaweedFS (the Parquet-in-S3 part)",
    ),
    "appends": Suite(
        "How fast do models learn appended rows, against retraining on the union?",
        "bench.append",
    ),
    "scale": Suite(
        "What do N rows cost on one machine: registration against the disk, training, "
        "appends, deletions, the update after an exact retrain, and every process's memory?",
        "bench.scale",
        "SeaweedFS",
    ),
    "request-path": Suite(
        "How many requests a second does the API take under load, against a minimal endpoint?",
        "bench.request_path",
        "wrk (apt-get install wrk)",
    ),
    "erasure-cost": Suite(
        "What does crypto-shredding cost on SQLite and PostgreSQL?",
        "bench.erasure",
        "PostgreSQL",
    ),
    "audit-power": Suite(
        "Does a privacy audit find a false certificate, and how often does it alarm falsely?",
        "bench.audit",
    ),
    "convex-head": Suite(
        "How do convex_head's releases compare with retraining, in time and accuracy?",
        "bench.convex_head",
    ),
    "convex-resident": Suite(
        "How fast is convex_head's resident removal against its warm exact retrain at 1M rows?",
        "bench.convex_resident",
    ),
    "sharded": Suite(
        "What does sharded retraining (SISA) cost in accuracy, and save per deletion?",
        "bench.sharded",
    ),
    "noisy-finetune": Suite(
        "How much accuracy does noisy fine-tuning keep at a true ε = 1?",
        "bench.noisy_finetune",
        "the bench extra (pip install -e '.[bench]'): matplotlib",
    ),
    "overparameterized": Suite(
        "Is minnorm's projection the retrained model, and at what cost?",
        "bench.overparameterized",
    ),
    "topic-models": Suite(
        "What does unlearning a topic model cost, and how much noise does its bound need?",
        "bench.topic_models",
    ),
    "recollection": Suite(
        "What do recollection's statistics cost to record, and what does a request cost?",
        "bench.recollection",
    ),
    "newton": Suite(
        "How does the certified Newton step compare with projected retraining?",
        "bench.newton",
    ),
    "device": Suite(
        "What does each method's compute take on a CPU or a GPU (no service)?",
        "bench.device",
        "a GPU for --device cuda",
    ),
    "publication-timing": Suite(
        "Does a requester's clock tell which branch ran, with and without constant-time "
        "publication?",
        "bench.publication",
    ),
    "log": Suite(
        "What does the Merkle tree cost per certificate, and how large are its proofs?",
        "bench.transparency",
        "PostgreSQL",
    ),
}


def listing() -> str:
    width = max(map(len, SUITES))
    lines = ["suites (python -m bench <suite> --help for its options):", ""]
    for name, suite in SUITES.items():
        needs = f"  [needs {suite.needs}]" if suite.needs else ""
        lines.append(f"  {name:<{width}}  {suite.question}{needs}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("--list", "-l", "--help", "-h"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    suite = SUITES.get(name)
    if suite is None:
        print(f"no suite {name!r}\n\n{listing()}", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {name}", *rest]
    importlib.import_module(suite.module).main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
