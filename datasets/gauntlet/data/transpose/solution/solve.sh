#!/bin/bash
set -e
awk '{ for (i = 1; i <= NF; i++) m[NR, i] = $i; if (NF > n) n = NF }
	END { for (i = 1; i <= n; i++) { s = m[1, i]; for (r = 2; r <= NR; r++) s = s " " m[r, i]; print s } }' \
	/app/matrix.txt > /app/transposed.txt
