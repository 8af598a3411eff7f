#!/usr/bin/env bash
# vendor-console.sh fetches the web console's one front-end library, uPlot, from the npm
# registry and writes the files the console embeds (pkg/console/static/vendor). The
# output is committed: the binary serves it offline and nothing loads from a CDN.
#
#   scripts/vendor-console.sh
#
# Reproducible: the version and the package's integrity (the sha512 the registry
# publishes as dist.integrity) are pinned below, the tarball is checked against the
# pin before anything is extracted, and each file written is checked against its
# pinned sha256, which pkg/console's TestVendoredBundleMatchesPin also checks on the
# committed copy. To upgrade: change UPLOT_VERSION and UPLOT_INTEGRITY (from
# `npm view uplot@<version> dist.integrity`), run the script with UPDATE_PINS=1 to
# print the new sha256 lines, paste them below, and run it again.
set -euo pipefail

UPLOT_VERSION=1.6.32
UPLOT_INTEGRITY=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==

# file in the package -> sha256 of the file written
declare -A PINS=(
	[dist/uPlot.esm.js]=5dd9b3281aa64b461b42d9945f6adb2649d346502b12281a9ae0d46599a80eba
	[dist/uPlot.min.css]=df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04
	[LICENSE]=8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd
)

root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/pkg/console/static/vendor"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

command -v npm >/dev/null || { echo "vendor-console: npm not found" >&2; exit 1; }
(cd "$tmp" && npm pack "uplot@$UPLOT_VERSION" --silent >/dev/null)
tgz="$tmp/uplot-$UPLOT_VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [[ $got != "$UPLOT_INTEGRITY" ]]; then
	echo "vendor-console: uplot@$UPLOT_VERSION integrity $got, want $UPLOT_INTEGRITY" >&2
	exit 1
fi
tar -xzf "$tgz" -C "$tmp"

mkdir -p "$out"
status=0
for f in "${!PINS[@]}"; do
	name="$(basename "$f")"
	[[ $f == LICENSE ]] && name=uPlot.LICENSE
	sum="$(sha256sum "$tmp/package/$f" | cut -d' ' -f1)"
	if [[ ${UPDATE_PINS:-} == 1 ]]; then
		echo "	[$f]=$sum"
	elif [[ $sum != "${PINS[$f]}" ]]; then
		echo "vendor-console: $f of uplot@$UPLOT_VERSION has sha256 $sum, want ${PINS[$f]}" >&2
		status=1
		continue
	fi
	cp "$tmp/package/$f" "$out/$name"
done
printf 'uplot %s %s\n' "$UPLOT_VERSION" "$UPLOT_INTEGRITY" >"$out/VERSION"
exit $status
