#!/bin/bash
set -e
python3 - <<'EOF'
import collections, json, re

line_re = re.compile(r'"[A-Z]+ ([^ ?"]+)[^"]*" (\d{3}) ')
statuses, paths = collections.Counter(), collections.Counter()
total = 0
with open("/app/access.log") as f:
    for line in f:
        if not line.strip():
            continue
        total += 1
        m = line_re.search(line)
        paths[m.group(1)] += 1
        statuses[m.group(2)] += 1
top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
with open("/app/summary.json", "w") as f:
    json.dump({"total": total, "by_status": dict(statuses), "top_path": top}, f)
EOF
