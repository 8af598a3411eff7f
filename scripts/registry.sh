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
source scripts/launcher.sh
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
launcher_main "$cmd" "$dir" registry.sh "the registry" "$dir/launcher.log and $dir/registry.log" \
	./cmd/gauntlet-registry -port "$port"
