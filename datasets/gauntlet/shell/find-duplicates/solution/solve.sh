#!/bin/bash
set -e
find /app/files -type f -print0 | xargs -0 sha256sum | LC_ALL=C sort |
	awk '{ h = substr($0, 1, 64); p = substr($0, 67); g[h] = (h in g) ? g[h] "\n" p : p; n[h]++ }
	END { for (h in g) if (n[h] > 1) print g[h] "\n" }' |
	awk 'BEGIN { RS = ""; FS = "\n" } { line = $1; for (i = 2; i <= NF; i++) line = line " | " $i; print line }' |
	LC_ALL=C sort > /app/duplicates.txt
