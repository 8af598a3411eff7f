#!/bin/bash
set -e
cat > /app/durations.py <<'EOF'
"""Durations written as 1h30m."""
import re

_RE = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?", re.ASCII)


def parse_duration(text):
    """The number of seconds text stands for."""
    m = _RE.fullmatch(text)
    if not text or m is None:
        raise ValueError(f"not a duration: {text!r}")
    d, h, mi, s = (int(g) if g is not None else 0 for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s
EOF
