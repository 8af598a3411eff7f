#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/error_count.txt ] && [ "$(tr -d '[:space:]' < /app/error_count.txt)" = "$(tr -d '[:space:]' < /tests/expected)" ]; then
	reward=1
else
	echo "error_count.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
