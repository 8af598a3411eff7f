#!/bin/bash
set -e
find /app/logs -type f -name '*.log' -exec cat {} + | grep -c 'ERROR' > /app/error_count.txt
