#!/usr/bin/env python3
"""Check tests/golden/memory/recall.yaml (Python 3 standard library only).

Parses exactly the file's restricted YAML format (comments, two top-level lists `entries` and
`queries`, items of `key: value` pairs, values either JSON double-quoted strings or bare scalars),
then verifies: unique entry ids, every `expect` names an entry, each query shares no token with
its target entry (lowercase, split on non-alphanumerics, stop words included), and the minimum
counts. Exits 1 on any problem. Usage: check_recall_set.py [path/to/recall.yaml]
"""
import json
import os
import re
import sys

MIN_ENTRIES = 40
MIN_QUERIES = 25
FIELDS = {"entries": ("id", "content"), "queries": ("query", "expect")}
TOKEN = re.compile(r"[^\W_]+")  # runs of alphanumerics; everything else separates


def tokens(text):
    return set(TOKEN.findall(text.lower()))


def parse_scalar(raw, where):
    raw = raw.strip()
    if raw.startswith('"'):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: bad quoted string {raw!r}: {e}")
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {raw!r}")
        return value
    if raw.startswith("'") or raw == "" or raw[0] in "[{&*!|>%@`" or " #" in raw:
        raise ValueError(f"{where}: unsupported value {raw!r} (use a double-quoted string)")
    return raw


def parse(text):
    """Return {"entries": [...], "queries": [...]} as lists of dicts."""
    doc = {}
    section = None
    item = None
    for n, line in enumerate(text.splitlines(), 1):
        where = f"line {n}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise ValueError(f"{where}: tab in indentation")
        m = re.fullmatch(r"(\w+):\s*", line)
        if m:
            section = m.group(1)
            if section not in FIELDS:
                raise ValueError(f"{where}: unknown top-level key {section!r}")
            if section in doc:
                raise ValueError(f"{where}: duplicate top-level key {section!r}")
            doc[section] = []
            item = None
            continue
        if section is None:
            raise ValueError(f"{where}: content before any top-level key")
        m = re.fullmatch(r"  - (\w+):(?: (.*))?", line)
        if m:
            item = {}
            doc[section].append(item)
        else:
            m = re.fullmatch(r"    (\w+):(?: (.*))?", line)
            if not m or item is None:
                raise ValueError(f"{where}: unexpected line {line!r}")
        key, raw = m.group(1), m.group(2) or ""
        if key not in FIELDS[section]:
            raise ValueError(f"{where}: unknown key {key!r} in {section}")
        if key in item:
            raise ValueError(f"{where}: duplicate key {key!r}")
        item[key] = parse_scalar(raw, where)
    for section, fields in FIELDS.items():
        if section not in doc:
            raise ValueError(f"missing top-level key {section!r}")
        for i, it in enumerate(doc[section]):
            for f in fields:
                if not it.get(f, "").strip():
                    raise ValueError(f"{section}[{i}]: missing or empty {f!r}")
    return doc


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "recall.yaml")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = parse(text)
    except ValueError as e:
        print(f"PARSE ERROR: {e}")
        return 1

    problems = []
    entries = {}
    for e in doc["entries"]:
        if e["id"] in entries:
            problems.append(f"duplicate entry id {e['id']}")
        entries[e["id"]] = e["content"]
    contents = [e["content"].strip().lower() for e in doc["entries"]]
    for c in sorted({c for c in contents if contents.count(c) > 1}):
        problems.append(f"duplicate entry content {c!r}")

    seen_queries = set()
    targeted = set()
    for i, q in enumerate(doc["queries"]):
        text_q, target = q["query"], q["expect"]
        if text_q.strip().lower() in seen_queries:
            problems.append(f"queries[{i}]: duplicate query {text_q!r}")
        seen_queries.add(text_q.strip().lower())
        if target not in entries:
            problems.append(f"queries[{i}] {text_q!r}: expect {target!r} is not an entry id")
            continue
        targeted.add(target)
        shared = tokens(text_q) & tokens(entries[target])
        if shared:
            problems.append(f"queries[{i}] {text_q!r} -> {target}: shares tokens "
                            f"{sorted(shared)} with {entries[target]!r}")

    n_entries, n_queries = len(entries), len(doc["queries"])
    distractors = sorted(set(entries) - targeted)
    if n_entries < MIN_ENTRIES:
        problems.append(f"only {n_entries} entries (need >= {MIN_ENTRIES})")
    if n_queries < MIN_QUERIES:
        problems.append(f"only {n_queries} queries (need >= {MIN_QUERIES})")
    if not distractors:
        problems.append("no distractor entries (entries without a query)")

    print(f"entries: {n_entries}")
    print(f"queries: {n_queries}")
    print(f"entries targeted by a query: {len(targeted)}")
    print(f"distractors (no query): {len(distractors)} {' '.join(distractors)}")
    for p in problems:
        print(f"PROBLEM: {p}")
    if problems:
        print(f"FAIL: {len(problems)} problem(s)")
        return 1
    print("OK: ids unique, every expect exists, every query token-disjoint from its target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
