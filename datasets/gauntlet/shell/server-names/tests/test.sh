#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/names.txt ] && diff /app/names.txt /tests/expected.txt; then
	reward=1
else
	echo "names.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
