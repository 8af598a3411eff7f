#!/bin/bash
set -e
find /app/docs -type f -name '*.txt' -exec sed -i 's/\r$//' {} +
