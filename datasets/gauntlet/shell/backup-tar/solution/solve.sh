#!/bin/bash
set -e
cd /app
tar --exclude='*.tmp' -czf /app/backup.tar.gz site
