#!/bin/bash
set -e
jq -r '.[] | select(.active == true) | .email | ascii_downcase' /app/users.json | sort -u > /app/active_emails.txt
