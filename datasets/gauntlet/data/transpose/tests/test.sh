#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/transposed.txt ] && diff /app/transposed.txt /tests/expected.txt; then
	reward=1
else
	echo "transposed.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
