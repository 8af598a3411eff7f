#!/bin/bash
set -e
cat > /app/backup.sh <<'EOF'
#!/bin/bash
# Usage: backup.sh SRC DEST
set -euo pipefail
src=$1
dest=$2
mkdir -p -- "$dest"
for f in "$src"/*.txt; do
	[ -f "$f" ] || continue
	cp -- "$f" "$dest/"
done
EOF
