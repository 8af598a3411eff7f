#!/bin/bash
set -e
cat > /app/export.py <<'EOF'
"""Export a JSON array of objects as CSV."""
import csv
import json
import sys


def main(src, dst):
    with open(src) as f:
        items = json.load(f)
    keys = list(items[0])
    with open(dst, "w", newline="") as out:
        w = csv.writer(out)
        w.writerow(keys)
        for item in items:
            w.writerow("" if item.get(k) is None else str(item.get(k)) for k in keys)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
EOF
