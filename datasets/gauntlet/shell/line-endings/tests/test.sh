#!/bin/bash
mkdir -p /logs/verifier
reward=0
if [ "$(find /app/docs -type f | wc -l)" -ne 5 ]; then
	echo "files were added or removed"
elif ! sha256sum --quiet -c /tests/expected.sha256; then
	echo "some files are wrong"
else
	reward=1
fi

echo "$reward" > /logs/verifier/reward.txt
