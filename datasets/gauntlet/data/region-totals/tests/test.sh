#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/totals.csv ] && diff <(sed 's/\r$//' /app/totals.csv) /tests/expected.csv; then
	reward=1
else
	echo "totals.csv is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
