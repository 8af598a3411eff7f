#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/projects.md ] && diff /app/projects.md /tests/expected.md; then
	reward=1
else
	echo "projects.md is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
