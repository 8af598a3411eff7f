#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/unique.txt ] && diff /app/unique.txt /tests/expected.txt; then
	reward=1
else
	echo "unique.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
