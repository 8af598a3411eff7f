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
source scripts/launcher.sh
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [[ $cmd == start ]] && ((EUID != 0)); then
	echo "containerd.sh: containerd needs root" >&2
	exit 1
fi
launcher_main "$cmd" "$dir" containerd.sh containerd "$dir/launcher.log and $dir/containerd.log" \
	./cmd/gauntlet-containerd -root-tmpfs-bytes "$tmpfs"
