#!/bin/bash
set -e
python3 - <<'EOF'
import re
path = "/app/stats.py"
src = open(path).read()
fixed = '''def median(values):
    """The median of a non-empty list of numbers."""
    if not values:
        raise ValueError("median of an empty list")
    s = sorted(values)
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2
'''
src = re.sub(r"def median\(values\):.*\Z", fixed, src, flags=re.S)
open(path, "w").write(src)
EOF
