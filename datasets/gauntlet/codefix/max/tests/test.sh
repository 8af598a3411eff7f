#!/bin/bash
# Verifier: the test file unchanged, the visible tests passing, and the hidden cases
# printing exactly what a correct library prints. Writes 1 or 0 to reward.txt.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
reward=0
if [ "$(ls -A tests)" != "test_lib.sh" ] || ! cmp -s tests/test_lib.sh /tests/test_lib.sh.orig; then
	echo "tests/ was changed"
elif ! timeout 20 sh tests/test_lib.sh; then
	echo "the visible tests fail"
elif ! timeout 20 sh /tests/hidden.sh > /logs/verifier/hidden.out 2>/dev/null ||
	! cmp -s /logs/verifier/hidden.out /tests/hidden.expected; then
	echo "the hidden cases fail"
else
	reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
