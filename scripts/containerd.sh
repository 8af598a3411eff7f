#!/usr/bin/env bash
# containerd.sh starts and stops a private containerd for gauntlet's containerd sandbox
# runtime (no systemd needed): Debian's containerd and runc (scripts/deps.sh installs
# them), with config, root, state, socket and log under one directory. It runs
# cmd/gauntlet-containerd, the same launcher (pkg/ctrdlocal) the tests use.
#
#   scripts/containerd.sh start [DIR]   start in the background, wait until it answers,
#                                       print the socket path
#   scripts/containerd.sh stop  [DIR]   kill its containers, stop it, unmount its tmpfs
#   scripts/containerd.sh status [DIR]
#
# DIR defaults to .gauntlet/containerd. GAUNTLET_CONTAINERD_TMPFS (bytes, default 2 GiB)
# sizes the tmpfs its root lives on; 0 keeps the root on disk. Must run as root.
set -euo pipefail

cmd=${1:-}
dir=${2:-.gauntlet/containerd}
tmpfs=${GAUNTLET_CONTAINERD_TMPFS:-2147483648}
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
	((EUID == 0)) || { echo "containerd.sh: containerd needs root" >&2; exit 1; }
	mkdir -p "$dir/bin"
	go build -o "$dir/bin/gauntlet-containerd" ./cmd/gauntlet-containerd
	rm -f "$ready"
	nohup "$dir/bin/gauntlet-containerd" -dir "$dir" -root-tmpfs-bytes "$tmpfs" -ready-file "$ready" \
		>"$dir/launcher.log" 2>&1 &
	echo $! >"$pidfile"
	for _ in $(seq 600); do
		if [[ -s $ready ]]; then
			cat "$ready"
			exit 0
		fi
		if ! running; then
			echo "containerd.sh: the launcher exited; its log:" >&2
			tail -n 40 "$dir/launcher.log" >&2
			exit 1
		fi
		sleep 0.05
	done
	echo "containerd.sh: containerd did not answer within 30 s; see $dir/launcher.log and $dir/containerd.log" >&2
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
