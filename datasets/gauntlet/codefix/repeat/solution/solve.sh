#!/bin/bash
# Reference solution: the library with the bug fixed.
set -e
cat > /app/src/lib.sh <<'GAUNTLET_EOF'
#!/bin/sh
# Small shell library. One function below has a bug.

# Helpers used by the functions below. They are correct.
abs() {
	if [ "$1" -lt 0 ]; then
		echo $(( -$1 ))
	else
		echo "$1"
	fi
}

twice() {
	echo $(( $1 * 2 ))
}

repeat() {
	s=
	i=1
	while [ "$i" -le "$2" ]; do
		s="$s$1"
		i=$(( i + 1 ))
	done
	echo "$s"
}
GAUNTLET_EOF
