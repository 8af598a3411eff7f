#!/bin/bash
set -e
cat > /app/wordfreq.py <<'EOF'
"""Word frequencies."""
import collections
import re
import sys


def top_words(text, n):
    """The n most frequent words of text, as (word, count) tuples."""
    if n <= 0:
        return []
    counts = collections.Counter(re.findall(r"[a-z]+", text.lower()))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


if __name__ == "__main__":
    for word, count in top_words(sys.stdin.read(), int(sys.argv[1])):
        print(word, count)
EOF
