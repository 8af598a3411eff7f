#!/bin/bash
# Runs the hidden unit tests against the agent's module in /app; 1 when all pass.
mkdir -p /logs/verifier
reward=0
if cd /app && timeout 30 python3 -m unittest discover -s /tests -p 'test_export.py' -t /tests; then
	reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
