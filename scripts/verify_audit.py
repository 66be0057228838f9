#!/usr/bin/env python3
"""Verify a Lethe audit export with nothing but the standard library.

    curl -H "Authorization: Bearer $KEY" http://127.0.0.1:8000/v1/audit/export > audit.jsonl
    python3 scripts/verify_audit.py audit.jsonl

Each line is {"seq", "prev_hash", "entry_hash", "body"}; the chain holds when every
entry_hash == sha256(prev_hash + "\\n" + body) and every prev_hash is the previous entry_hash.
A line may carry "restricted" (measured constants that are functions of the removed data, in
auditors' exports only): each value must open its commitment in the body,
sha256(salt + "\\n" + canonical {"value": v}).
"""

import hashlib
import json
import sys

prev, n = "0" * 64, 0
with open(sys.argv[1], encoding="utf-8") as fh:
    for n, line in enumerate(fh, 1):
        row = json.loads(line)
        body = json.loads(row["body"])
        ok = (
            row["prev_hash"] == prev == body["prev_hash"]
            and body["seq"] == row["seq"]
            and hashlib.sha256(f"{prev}\n{row['body']}".encode()).hexdigest() == row["entry_hash"]
        )
        if not ok:
            sys.exit(f"chain broken at line {n} (seq {row['seq']})")
        restricted = row.get("restricted", {})
        sealed = [
            (name, e, body["constants"][name])
            for name, e in restricted.get("constants", {}).items()
        ]
        sealed += [(name, e, body[name]) for name, e in restricted.get("fields", {}).items()]
        for name, entry, shown in sealed:
            value = json.dumps({"value": entry["value"]}, sort_keys=True, separators=(",", ":"))
            opened = hashlib.sha256(f"{entry['salt']}\n{value}".encode()).hexdigest()
            if opened != shown["commitment"]:
                sys.exit(f"restricted value {name} does not open its commitment at line {n}")
        prev = row["entry_hash"]
print(f"chain holds: {n} certificates, head {prev}")
