#!/bin/bash
set -e
python3 - <<'EOF'
import csv, json

with open("/app/users.csv") as f:
    users = {r["id"]: r["name"] for r in csv.DictReader(f)}
out = {name: {"orders": 0, "total_cents": 0} for name in users.values()}
with open("/app/orders.csv") as f:
    for r in csv.DictReader(f):
        name = users.get(r["user_id"])
        if name is not None:
            out[name]["orders"] += 1
            out[name]["total_cents"] += int(r["amount_cents"])
with open("/app/summary.json", "w") as f:
    json.dump(out, f, indent=2)
EOF
