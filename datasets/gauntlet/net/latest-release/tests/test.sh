#!/bin/bash
# Checks /app/VERSION and /app/SHA256 against the release the index names newest stable
# (the verifier needs no network: the expected answer is here).
mkdir -p /logs/verifier
reward=0
if [ "$(cat /app/VERSION 2>/dev/null | tr -d '[:space:]')" = "2.10.1" ] &&
	[ "$(cat /app/SHA256 2>/dev/null | tr -d '[:space:]')" = "c0ffee00d15ea5e5ba5eba11facade0ddba11cafe0b0e5c0de5eed5ca1ab1e5" ]; then
	reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
