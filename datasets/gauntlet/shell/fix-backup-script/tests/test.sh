#!/bin/bash
mkdir -p /logs/verifier
reward=0
work=$(mktemp -d)
src="$work/my docs"
mkdir -p "$src/sub"
printf 'a\n' > "$src/plain.txt"
printf 'b\n' > "$src/with space.txt"
printf 'c\n' > "$src/-dash.txt"
printf 'd\n' > "$src/notes.md"
printf 'e\n' > "$src/txt"
printf 'f\n' > "$src/sub/deep.txt"
dest="$work/out dir/nested"
if ! (cd "$work" && timeout 20 bash /app/backup.sh "$src" "$dest"); then
	echo "backup.sh failed"
elif [ "$(cd "$dest" && ls -A | sort | tr '\n' '|')" != "-dash.txt|plain.txt|with space.txt|" ]; then
	echo "wrong files copied:"; ls -A "$dest"
elif [ "$(cat "$dest/with space.txt")" != b ] || [ "$(cat -- "$dest/-dash.txt")" != c ]; then
	echo "contents differ"
else
	reward=1
fi
rm -rf "$work"

echo "$reward" > /logs/verifier/reward.txt
