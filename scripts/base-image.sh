#!/usr/bin/env bash
# base-image.sh makes gauntlet's Debian base image from Debian's own packages, so task
# images can start FROM a real Debian without any container registry on the internet.
#
#   scripts/base-image.sh                    build (or reuse) the image, print its OCI
#                                            layout directory
#   scripts/base-image.sh --push REGISTRY    also push it as REGISTRY/debian:bookworm,
#                                            and as library/debian:bookworm and
#                                            :bookworm-slim for Docker Hub names through
#                                            a mirror (plain HTTP: a loopback registry
#                                            such as the one pkg/registrylocal starts)
#
# mmdebstrap (scripts/deps.sh installs it, with buildah) makes a minimal bookworm rootfs
# (variant minbase: apt and dpkg work, so a Dockerfile can apt-get install; package
# lists removed, as in the usual Debian images, so run apt-get update first; no
# documentation, man pages or locales). The rootfs tarball becomes the single layer of an
# OCI image layout written here (gzip -n, fixed times: the same tarball gives the same
# digests). Both are cached under ${XDG_CACHE_HOME:-~/.cache}/gauntlet/images/base, in a
# directory named by the digest of this script and its inputs: the rootfs is rebuilt only
# when they change (or with GAUNTLET_BASE_REBUILD=1, to take newer packages), and older
# directories are removed then. A cold build takes a minute or two (mostly downloads
# and dpkg); a cached one returns at once. Pushing goes through buildah's storage in the
# same cache directory. Must run as root (mmdebstrap's root mode, buildah's storage).
set -euo pipefail

suite=bookworm
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
arch=$(dpkg --print-architecture)

push=""
while (($#)); do
	case $1 in
	--push)
		[[ $# -ge 2 && -n $2 ]] || { echo "base-image.sh: --push needs a registry (host:port)" >&2; exit 2; }
		push=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "base-image.sh: unknown argument $1 (see --help)" >&2
		exit 2
		;;
	esac
done

((EUID == 0)) || { echo "base-image.sh: must run as root (mmdebstrap, buildah)" >&2; exit 1; }
for tool in mmdebstrap buildah gzip sha256sum; do
	command -v "$tool" >/dev/null || { echo "base-image.sh: $tool not found: run scripts/deps.sh" >&2; exit 1; }
done

# The image's inputs: mmdebstrap's arguments and the image config. Their digest names
# the cache directory, so editing this script's comments rebuilds nothing.
mmargs=(--mode=root --variant=minbase --format=tar --architectures="$arch"
	--skip=output/dev
	--aptopt='Apt::Install-Recommends "false"'
	--dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/locale/*'
	--dpkgopt='path-include=/usr/share/locale/locale.alias'
	"$suite" -
	"deb $mirror $suite main"
	"deb $mirror $suite-updates main"
	"deb $security $suite-security main")
imageenv='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","LANG=C.UTF-8"'
inputs=$(printf '%s\n' "${mmargs[@]}" "$imageenv" | sha256sum | cut -c1-16)

cache=${XDG_CACHE_HOME:-$HOME/.cache}/gauntlet/images/base
name=debian-$suite-$arch-$inputs
out=$cache/$name
mkdir -p "$cache"

# One build at a time per cache: a second caller waits and then finds the result.
exec 9>"$cache/.lock"
flock 9

if [[ ${GAUNTLET_BASE_REBUILD:-} == 1 ]]; then
	rm -rf "$out"
fi

if [[ ! -f $out/oci/index.json ]]; then
	tmp=$cache/.tmp-$name
	rm -rf "$tmp"
	mkdir -p "$tmp/oci/blobs/sha256"
	echo "base-image.sh: building $name with mmdebstrap (a minute or two)" >&2
	# mmdebstrap writes the tarball to stdout ("-"); its scratch goes under the cache.
	if ! TMPDIR=$tmp mmdebstrap "${mmargs[@]}" >"$tmp/rootfs.tar" 2>"$tmp/mmdebstrap.log"; then
		echo "base-image.sh: mmdebstrap failed; the end of its log ($tmp/mmdebstrap.log):" >&2
		tail -n 30 "$tmp/mmdebstrap.log" >&2
		exit 1
	fi

	# The OCI image layout (image-spec image-layout.md): one gzip layer, its config, the
	# manifest and an index naming it "bookworm".
	blobs=$tmp/oci/blobs/sha256
	diffid=$(sha256sum <"$tmp/rootfs.tar" | cut -d' ' -f1)
	gzip -n -c "$tmp/rootfs.tar" >"$tmp/layer.tar.gz"
	layer=$(sha256sum <"$tmp/layer.tar.gz" | cut -d' ' -f1)
	mv "$tmp/layer.tar.gz" "$blobs/$layer"
	layersize=$(stat -c %s "$blobs/$layer")
	created=2000-01-01T00:00:00Z
	printf '{"created":"%s","architecture":"%s","os":"linux","config":{"Env":[%s],"Cmd":["bash"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"gauntlet scripts/base-image.sh: mmdebstrap --variant=minbase %s"}]}' \
		"$created" "$arch" "$imageenv" "$diffid" "$created" "$suite" >"$tmp/config.json"
	config=$(sha256sum <"$tmp/config.json" | cut -d' ' -f1)
	configsize=$(stat -c %s "$tmp/config.json")
	mv "$tmp/config.json" "$blobs/$config"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%d}]}' \
		"$config" "$configsize" "$layer" "$layersize" >"$tmp/manifest.json"
	manifest=$(sha256sum <"$tmp/manifest.json" | cut -d' ' -f1)
	manifestsize=$(stat -c %s "$tmp/manifest.json")
	mv "$tmp/manifest.json" "$blobs/$manifest"
	printf '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"org.opencontainers.image.ref.name":"%s"},"platform":{"architecture":"%s","os":"linux"}}]}' \
		"$manifest" "$manifestsize" "$suite" "$arch" >"$tmp/oci/index.json"
	rm -f "$tmp/rootfs.tar"

	# Older base images of this cache are stale now.
	find "$cache" -mindepth 1 -maxdepth 1 -name "debian-$suite-$arch-*" ! -name "$name" -exec rm -rf {} +
	mv "$tmp" "$out"
fi

if [[ -n $push ]]; then
	storage=(--root "$cache/buildah/root" --runroot "$cache/buildah/run" --storage-driver vfs)
	# A relative oci: path: buildah names the pulled image after the path, and the
	# ".cache" of an absolute one is not a valid name component.
	id=$(cd "$out" && buildah "${storage[@]}" pull --quiet "oci:oci:$suite" 2>"$cache/push.log") || {
		echo "base-image.sh: buildah pull oci:$out/oci failed:" >&2
		tail -n 20 "$cache/push.log" >&2
		exit 1
	}
	# debian:bookworm for Dockerfiles that name the registry; library/debian:bookworm
	# and :bookworm-slim for those that say FROM debian:bookworm(-slim), through a
	# Docker Hub mirror (images.Options.DockerHubMirror) set to this registry. Minbase
	# without documentation, man pages or locales is what Debian's -slim images are.
	for name in "debian:$suite" "library/debian:$suite" "library/debian:$suite-slim"; do
		if ! buildah "${storage[@]}" push --quiet --tls-verify=false "$id" "docker://$push/$name" >"$cache/push.log" 2>&1; then
			echo "base-image.sh: buildah push to $push/$name failed:" >&2
			tail -n 20 "$cache/push.log" >&2
			exit 1
		fi
	done
fi

echo "$out/oci"
