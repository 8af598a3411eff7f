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

clamp() {
	if [ "$1" -lt "$2" ]; then
		echo "$2"
	elif [ "$1" -gt "$3" ]; then
		echo "$3"
	else
		echo "$1"
	fi
}
GAUNTLET_EOF
