#!/bin/bash
set -e
python3 - <<'EOF'
import configparser, json, re

cp = configparser.ConfigParser(interpolation=None)
cp.optionxform = str  # keep the keys' case
cp.read("/app/service.ini")

def value(v):
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v

out = {s: {k: value(v) for k, v in cp[s].items()} for s in cp.sections()}
with open("/app/service.json", "w") as f:
    json.dump(out, f, indent=2)
EOF
