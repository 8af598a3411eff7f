#!/usr/bin/env bash
# nats-server.sh builds the nats-server that gauntlet embeds (the version of
# github.com/nats-io/nats-server/v2 in go.mod) as a standalone binary, for the 3-node
# JetStream cluster of split mode (pkg/natslocal, scripts/split.sh), and prints its path.
#
#   scripts/nats-server.sh      # -> $(go env GOPATH)/bin/nats-server-v2.15.3
#
# Idempotent: when the binary there already reports the version, it only prints the path.
# It builds from the module cache through the Go module proxy, as `go build` of gauntlet
# does; nothing else is downloaded. deps.sh's nats-server (the version deploy/compose ships)
# is a different binary and is left alone.
set -euo pipefail

cd "$(dirname "$0")/.."
mod=github.com/nats-io/nats-server/v2
version="$(go list -m -f '{{.Version}}' "$mod")"
gopath="$(go env GOPATH)"
bin="${gopath%%:*}/bin/nats-server-$version"

if [[ -x $bin ]] && [[ "$("$bin" --version 2>/dev/null)" == "nats-server: $version" ]]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$(dirname "$bin")"
tmp="$(mktemp "$bin.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
# Built from this module, so go.sum pins it; renamed into place so that concurrent runs
# never see a half-written binary.
go build -trimpath -o "$tmp" "$mod"
have="$("$tmp" --version)"
if [[ $have != "nats-server: $version" ]]; then
	echo "nats-server.sh: built $have, want $version" >&2
	exit 1
fi
mv -f "$tmp" "$bin"
trap - EXIT
echo "$bin"
