#!/bin/bash
set -e
sed 's/#.*//' /app/nginx.conf | tr '\n' ' ' | tr ';' '\n' |
	awk '$1 == "server_name" { for (i = 2; i <= NF; i++) print $i }' | sort -u > /app/names.txt
