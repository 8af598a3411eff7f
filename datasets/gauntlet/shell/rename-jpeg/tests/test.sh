#!/bin/bash
mkdir -p /logs/verifier
reward=0
count=$(find /app/photos -type f | wc -l)
if [ -n "$(find /app/photos -type f -name '*.jpeg')" ]; then
	echo "files ending in .jpeg remain"
elif [ "$count" -ne 6 ]; then
	echo "expected 6 files, found $count"
elif ! sha256sum --quiet -c /tests/expected.sha256; then
	echo "names or contents are wrong"
else
	reward=1
fi

echo "$reward" > /logs/verifier/reward.txt
