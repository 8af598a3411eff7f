#!/bin/bash
mkdir -p /logs/verifier
reward=0
if python3 -c '
import json, sys
got = json.load(open("/app/service.json"))
want = json.load(open("/tests/expected.json"))
def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
sys.exit(0 if same(got, want) else 1)
'; then
	reward=1
else
	echo "service.json is missing or wrong"
fi
echo "$reward" > /logs/verifier/reward.txt
