#!/bin/bash
set -e
awk '{ b = int($1 / 10); if (b > 9) b = 9; n[b]++ }
	END { for (b = 0; b < 10; b++) printf "%d-%d: %d\n", b * 10, (b == 9 ? 100 : b * 10 + 9), n[b] + 0 }' \
	/app/scores.txt > /app/histogram.txt
