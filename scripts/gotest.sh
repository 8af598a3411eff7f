#!/usr/bin/env bash
# go test, leaving nothing behind: `scripts/gotest.sh ARGS...` runs `go test ARGS...` in a
# session of its own and, however it ends (a pass, a failure, go test's timeout, Ctrl-C),
# then kills every process still in that session and removes the temporary directories
# the tests made in $TMPDIR since it started (Go's t.TempDir, named after the test, the
# local containerd's gctrd*, the gauntlet binary cmd/gauntlet's tests build in
# gauntlet-bin-*), unmounting what tests mounted below them first.
#
# A test binary ended by go test's timeout runs no cleanup: its servers die with it
# (they are started with a parent-death signal) but its directories stay, and a process
# a test started without that signal would outlive it. This is the net under both.
set -uo pipefail
tmp=${TMPDIR:-/tmp}
marker=$(mktemp "$tmp/gauntlet-gotest.XXXXXX")

setsid go test "$@" &
sid=$!
trap 'kill -INT "$sid" 2>/dev/null' INT TERM
wait "$sid"
rc=$?
# A signal interrupted the first wait; wait again for go test to finish its report.
while kill -0 "$sid" 2>/dev/null; do wait "$sid"; rc=$?; done

if pgrep -s "$sid" >/dev/null 2>&1; then
	echo "gotest.sh: killing what the tests left running:" >&2
	ps -o pid=,args= -s "$sid" >&2 || true
	pkill -KILL -s "$sid" 2>/dev/null || true
fi
# What live processes use (another go test on this machine, say) is left alone.
inuse=$(find /proc/[0-9]*/cwd /proc/[0-9]*/fd -maxdepth 1 -type l -printf '%l\n' 2>/dev/null |
	awk -v t="$tmp/" 'index($0, t) == 1 { split(substr($0, length(t) + 1), a, "/"); print t a[1] }' | sort -u)
find "$tmp" -mindepth 1 -maxdepth 1 -type d -newer "$marker" \( -name 'Test*' -o -name 'gctrd*' -o -name 'gauntlet-bin-*' \) -print0 |
	while IFS= read -r -d '' dir; do
		grep -qxF "$dir" <<<"$inuse" && continue
		findmnt -rn -o TARGET | awk -v d="$dir" 'index($0, d "/") == 1 || $0 == d' | sort -r |
			while IFS= read -r m; do umount -l "$m" 2>/dev/null || true; done
		chmod -R u+rwX "$dir" 2>/dev/null
		rm -rf "$dir" 2>/dev/null || echo "gotest.sh: could not remove $dir" >&2
	done
rm -f "$marker"
exit "$rc"
