"""Summarise a JUnit XML file of scripts/server-tests.sh as Markdown: counts
per test file, then every failure and error with the first line of its
message.

usage: report.py target/server-tests/junit.xml
"""

import collections
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    root = ET.parse(sys.argv[1]).getroot()
    per_file = collections.OrderedDict()
    failures = []
    for case in root.iter("testcase"):
        f = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name")
        outcome = "passed"
        msg = ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                msg = (el.get("message") or el.text or "").strip().splitlines()[0:1]
                msg = msg[0][:160] if msg else ""
                break
        per_file.setdefault(f, collections.Counter())[outcome] += 1
        if outcome in ("failed", "error"):
            failures.append((f, name, outcome, msg))
    total = collections.Counter()
    print("| file | passed | failed | error | skipped |")
    print("|---|---:|---:|---:|---:|")
    for f, c in per_file.items():
        total.update(c)
        print(f"| {f} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    print(f"| **total** | **{total['passed']}** | **{total['failed']}** | **{total['error']}** | **{total['skipped']}** |")
    print()
    for f, name, outcome, msg in failures:
        print(f"{f}::{name}\t{outcome}\t{msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
