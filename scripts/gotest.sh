#!/usr/bin/env bash
# go test, leaving nothing behind: `scripts/gotest.sh ARGS...` runs `go test ARGS...` in a
# session of its own, with a $TMPDIR of its own (a new directory under the caller's), and,
# however it ends (a pass, a failure, go test's timeout, Ctrl-C), then kills every process
# still in that session and removes that directory, unmounting what tests mounted below it
# first. Its output is go test's, followed by the run's slowest tests (testsummary/).
#
# A test binary ended by go test's timeout runs no cleanup: its servers die with it
# (they are started with a parent-death signal) but its directories stay, and a process
# a test started without that signal would outlive it. This is the net under both. The
# directory of its own is what keeps the net off other go test runs on the machine: their
# t.TempDir directories are named like this run's, and one held open by no process at the
# moment (between two steps of a test) looked like a leftover. Its name is short: Unix
# socket paths below it are limited to 107 bytes.
set -uo pipefail
parent=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$parent/gt.XXXX") || exit 1
export TMPDIR=$tmp

# The run's events go through testsummary, which writes go test's own output and then
# the slowest tests (what a CI log needs to say where its time went); if it cannot be
# built, go test writes as it does without it.
summary=""
if go build -o "$tmp/testsummary" "$(cd "$(dirname "$0")" && pwd)/testsummary" && mkfifo "$tmp/events"; then
	summary=$tmp/testsummary
	"$summary" <"$tmp/events" &
	spid=$!
	setsid go test -json "$@" >"$tmp/events" &
else
	echo "gotest.sh: no test summary; go test's output as it is" >&2
	setsid go test "$@" &
fi
sid=$!
trap 'kill -INT "$sid" 2>/dev/null' INT TERM
wait "$sid"
rc=$?
# A signal interrupted the first wait; wait again for go test to finish its report.
while kill -0 "$sid" 2>/dev/null; do wait "$sid"; rc=$?; done
if [[ -n $summary ]]; then
	wait "$spid"
fi

if pgrep -s "$sid" >/dev/null 2>&1; then
	echo "gotest.sh: killing what the tests left running:" >&2
	ps -o pid=,args= -s "$sid" >&2 || true
	pkill -KILL -s "$sid" 2>/dev/null || true
fi
findmnt -rn -o TARGET | awk -v d="$tmp" 'index($0, d "/") == 1' | sort -r |
	while IFS= read -r m; do umount -l "$m" 2>/dev/null || true; done
chmod -R u+rwX "$tmp" 2>/dev/null
rm -rf "$tmp" 2>/dev/null || echo "gotest.sh: could not remove $tmp" >&2
exit "$rc"
