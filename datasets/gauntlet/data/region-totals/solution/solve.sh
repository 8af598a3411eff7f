#!/bin/bash
set -e
{
	echo region,total
	awk -F, 'NR > 1 { t[$2] += $3 } END { for (r in t) printf "%s,%.2f\n", r, t[r] }' /app/sales.csv | sort
} > /app/totals.csv
