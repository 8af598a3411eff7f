#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/report.txt ] && diff /app/report.txt /tests/expected.txt; then
	reward=1
else
	echo "report.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
