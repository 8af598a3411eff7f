#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ -f /app/active_emails.txt ] && diff /app/active_emails.txt /tests/expected.txt; then
	reward=1
else
	echo "active_emails.txt is missing or wrong"
fi

echo "$reward" > /logs/verifier/reward.txt
