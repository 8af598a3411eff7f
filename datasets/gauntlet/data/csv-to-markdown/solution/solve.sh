#!/bin/bash
set -e
awk -F, '
	{ for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n = NF }
	function row(r,   i, s) { s = "|"; for (i = 1; i <= n; i++) s = s " " sprintf("%-" w[i] "s", c[r, i]) " |"; return s }
	END {
		print row(1)
		s = "|"; for (i = 1; i <= n; i++) { d = ""; for (j = 0; j < w[i]; j++) d = d "-"; s = s " " d " |" }
		print s
		for (r = 2; r <= NR; r++) print row(r)
	}' /app/projects.csv > /app/projects.md
