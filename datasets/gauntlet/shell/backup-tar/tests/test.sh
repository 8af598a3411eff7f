#!/bin/bash
mkdir -p /logs/verifier
reward=0
work=$(mktemp -d)
if ! tar -xzf /app/backup.tar.gz -C "$work" 2>/dev/null; then
	echo "backup.tar.gz is missing or not a gzip tar"
elif [ "$(cd "$work" && find . -type f | sed 's|^\./||' | sort)" != "$(cat /tests/expected_files)" ]; then
	echo "the archive holds the wrong files:"; (cd "$work" && find . -type f)
elif ! diff -r -x '*.tmp' /app/site "$work/site" >/dev/null; then
	echo "file contents differ"
elif [ ! -f /app/site/cache.tmp ]; then
	echo "/app/site was changed"
else
	reward=1
fi
rm -rf "$work"

echo "$reward" > /logs/verifier/reward.txt
