#!/bin/bash
set -e
awk '{ e = tolower($0); gsub(/^[ \t]+|[ \t\r]+$/, "", e); if (e != "" && !seen[e]++) print e }' /app/subscribers.txt > /app/unique.txt
