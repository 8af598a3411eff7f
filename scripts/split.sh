#!/usr/bin/env bash
# split.sh runs gauntlet in split mode on this machine, in the background: a 3-node NATS
# JetStream cluster of the version gauntlet embeds (streams and KV buckets at 3 replicas),
# ClickHouse as two replicas on a ZooKeeper (every process given both addresses), the
# Temporal dev server, and every service as its own `gauntlet serve
# --target=...` process (pkg/splitlocal's Layout: 2 schedulers, leader and standby, 3
# workers, 2 reward, 2 faults, 2 stores, the env API, the curriculum worker), each
# restarted when it dies.
#
#   scripts/split.sh up       # build gauntlet and nats-server if needed, start, wait until ready
#   scripts/split.sh up -- --worker.concurrency=64   # flags after -- go to every gauntlet serve
#   scripts/split.sh up --clickhouse.replicas 1      # one ClickHouse server, no ZooKeeper
#   scripts/split.sh up --chaos.seed 7 --chaos.rounds 3   # and kill parts at seeded random times
#   scripts/split.sh status   # every part and whether it is ready
#   scripts/split.sh down     # stop everything (the data stays in the data dir)
#
# Then `bin/gauntlet run --data-dir "$GAUNTLET_DATA"` (or with the default data dir, just
# `bin/gauntlet run`) runs against it, as against `gauntlet up`.
#
# Idempotent: up when the stack runs and down when it does not change nothing. The state
# file is <data dir>/split.json (the data dir is $GAUNTLET_DATA, else .gauntlet); up's log
# is <data dir>/split.log. up runs scripts/deps.sh first (ClickHouse, ZooKeeper, the
# Temporal CLI; idempotent), so a fresh machine with Go needs nothing else.
set -euo pipefail

cd "$(dirname "$0")/.."
DATA="${GAUNTLET_DATA:-.gauntlet}"
BIN=bin/gauntlet
export PATH="$PATH:$(go env GOPATH)/bin"

die() {
	echo "split.sh: $*" >&2
	exit 1
}

# running tells whether the `gauntlet split up` recorded in the state file still runs.
running() {
	local pid
	pid="$(sed -n 's/^  "pid": \([0-9]*\),$/\1/p' "$DATA/split.json" 2>/dev/null || true)"
	[[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q ' split up '
}

up() {
	if running; then
		echo "split stack already up in $DATA"
		"$BIN" split status --data-dir "$DATA" || true
		return
	fi
	mkdir -p "$DATA" bin
	bash scripts/deps.sh # idempotent: installs what a fresh machine lacks, else returns at once
	go build -o "$BIN" ./cmd/gauntlet
	local nats
	nats="$(scripts/nats-server.sh)"
	setsid nohup "$BIN" split up --data-dir "$DATA" --nats-server "$nats" "$@" >"$DATA/split.log" 2>&1 </dev/null &
	local pid=$!
	local deadline=$((SECONDS + 300))
	until "$BIN" split status --data-dir "$DATA" >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 40 "$DATA/split.log" >&2
			die "gauntlet split up exited before the stack was up (log: $DATA/split.log)"
		fi
		if ((SECONDS > deadline)); then
			tail -n 40 "$DATA/split.log" >&2
			die "the split stack was not up within 5 minutes (log: $DATA/split.log)"
		fi
		sleep 1
	done
	"$BIN" split status --data-dir "$DATA"
}

case "${1:-}" in
up)
	shift
	up "$@"
	;;
down)
	[[ -x $BIN ]] || go build -o "$BIN" ./cmd/gauntlet
	"$BIN" split down --data-dir "$DATA"
	;;
status)
	[[ -x $BIN ]] || die "no $BIN: run scripts/split.sh up"
	"$BIN" split status --data-dir "$DATA"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
