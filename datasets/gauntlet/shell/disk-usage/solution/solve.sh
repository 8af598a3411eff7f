#!/bin/bash
set -e
cd /app/data
for d in */; do
	d=${d%/}
	printf '%s %s\n' "$d" "$(find "$d" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')"
done | sort -k2,2nr -k1,1 > /app/report.txt
