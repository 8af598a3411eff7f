#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/answer.txt ] && [ "$(tr -d '[:space:]' < /app/answer.txt)" = Initech ]; then
	reward=1
else
	echo "answer.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
