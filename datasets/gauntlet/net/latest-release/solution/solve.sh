#!/bin/bash
set -e
python3 - <<'PY'
import json, time, urllib.request

url = "http://releases.example.test/v1/widget/releases.json"
for attempt in range(8):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            index = json.loads(r.read())
        break
    except Exception as e:  # a fault: try again
        print("attempt", attempt, "failed:", e)
        time.sleep(0.2)
else:
    raise SystemExit("the release service did not answer")

def key(v):
    return tuple(int(p) for p in v.split("."))

stable = [r for r in index["releases"] if not r["prerelease"]]
best = max(stable, key=lambda r: key(r["version"]))
open("/app/VERSION", "w").write(best["version"] + "\n")
open("/app/SHA256", "w").write(best["sha256"] + "\n")
PY
