#!/bin/bash
mkdir -p /logs/verifier
reward=0
if python3 -c '
import json, sys
got = json.load(open("/app/summary.json"))
want = json.load(open("/tests/expected.json"))
sys.exit(0 if got == want and all(type(v) is int for u in got.values() for v in u.values()) else 1)
'; then
	reward=1
else
	echo "summary.json is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
