#!/usr/bin/env bash
# registry.sh starts and stops a private OCI registry for task images (docs/images.md):
# Debian's docker-registry (scripts/deps.sh installs it) on 127.0.0.1, plain HTTP, with
# config, storage and log under one directory. It runs cmd/gauntlet-registry, the same
# launcher (pkg/registrylocal) the tests use.
#
#   scripts/registry.sh start  [DIR]   start in the background, wait until it answers,
#                                      print its host:port
#   scripts/registry.sh stop   [DIR]   stop it (the storage stays)
#   scripts/registry.sh status [DIR]
#
# DIR defaults to .gauntlet/registry; GAUNTLET_REGISTRY_PORT (default 5000; 0 picks a
# free port) is the port. Then scripts/base-image.sh --push 127.0.0.1:5000 serves the
# Debian base image from it.
set -euo pipefail

cmd=${1:-}
dir=${2:-.gauntlet/registry}
port=${GAUNTLET_REGISTRY_PORT:-5000}
cd "$(dirname "$0")/.."
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pidfile="$dir/launcher.pid"
ready="$dir/ready"

running() { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case $cmd in
start)
	if running; then
		cat "$ready"
		exit 0
	fi
	mkdir -p "$dir/bin"
	go build -o "$dir/bin/gauntlet-registry" ./cmd/gauntlet-registry
	rm -f "$ready"
	nohup "$dir/bin/gauntlet-registry" -dir "$dir" -port "$port" -ready-file "$ready" \
		>"$dir/launcher.log" 2>&1 &
	echo $! >"$pidfile"
	for _ in $(seq 600); do
		if [[ -s $ready ]]; then
			cat "$ready"
			exit 0
		fi
		if ! running; then
			echo "registry.sh: the launcher exited; its log:" >&2
			tail -n 40 "$dir/launcher.log" >&2
			exit 1
		fi
		sleep 0.05
	done
	echo "registry.sh: the registry did not answer within 30 s; see $dir/launcher.log and $dir/registry.log" >&2
	exit 1
	;;
stop)
	if running; then
		pid=$(cat "$pidfile")
		kill -TERM "$pid"
		for _ in $(seq 600); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
	fi
	rm -f "$pidfile" "$ready"
	;;
status)
	if running; then
		echo "running: $(cat "$ready" 2>/dev/null)"
	else
		echo "stopped"
		exit 3
	fi
	;;
*)
	echo "usage: $0 start|stop|status [DIR]" >&2
	exit 2
	;;
esac
