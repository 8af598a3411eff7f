#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/duplicates.txt ] && diff /app/duplicates.txt /tests/expected.txt; then
	reward=1
else
	echo "duplicates.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
