#!/usr/bin/env bash
# deps.sh installs everything gauntlet needs on a fresh Debian bookworm machine.
#
#   sudo scripts/deps.sh     (or as root: scripts/deps.sh)
#
# Idempotent: it only installs what is missing, so a second run changes nothing and
# returns in well under a second. Quiet when all goes well; on failure it names the
# step that failed, shows the tail of that step's output and exits non-zero.
#
# What it installs:
#   - Debian packages: clickhouse-server, clickhouse-client (ClickHouse 18.16, run by
#     pkg/chlocal as a child process, never as a system service) and protobuf-compiler;
#     containerd and runc (containerd 1.6, run by pkg/ctrdlocal / scripts/containerd.sh,
#     never as a system service) and busybox-static (the containerd sandboxes' base image);
#     crun, the OCI runtime the containerd sandboxes use when installed (faster starts).
#   - Go tools, into $(go env GOPATH)/bin: protoc-gen-go, protoc-gen-connect-go, protoc-gen-go-vtproto, staticcheck
#     and the Temporal CLI (its `temporal server start-dev` is the dev server
#     pkg/temporallocal runs; about 2.5 minutes to build), at the pinned versions below
#     (re-installed when the binary there reports another version), and the nats-server
#     of the version deploy/ ships, which a test runs the stack against.
#   - bubblewrap and util-linux (setpriv): the process sandbox runtime (pkg/sandbox/process).
#   - libfaketime: the clock_skew fault in process sandboxes (LD_PRELOAD, docs/faults.md).
#   - python3 and jq: tools the tasks of datasets/gauntlet install in their images, which
#     the dataset's host check (datasets/datasets_test.go) finds on the host instead.
#   - the fuse kernel module loaded (/dev/fuse): storage faults in the commands of process
#     sandboxes (pkg/sandbox/faultfuse mounts directly as root: no fusermount needed).
#   - mmdebstrap, buildah and docker-registry: task images (pkg/images, docs/images.md).
#     mmdebstrap makes the Debian base image from Debian's packages
#     (scripts/base-image.sh), buildah builds Dockerfiles, docker-registry is the local
#     registry the images go through (pkg/registrylocal, scripts/registry.sh).
#   - zookeeper (3.8, on the installed openjdk 17): the coordination ClickHouse 18.16's
#     replicated tables need; pkg/zklocal runs it as a child process for chlocal's
#     replicated mode (docs/architecture.md), never as a system service (that is the
#     separate zookeeperd package, not installed).
#   - chromium: the web console's browser tests (pkg/console, docs/console.md) drive it
#     headless through chromedp.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

APT_PACKAGES=(clickhouse-server clickhouse-client protobuf-compiler bubblewrap util-linux containerd runc crun busybox-static)

# libfaketime: clock_skew in process sandboxes (pkg/sandbox/process ClockSkewEnv).
APT_PACKAGES+=(libfaketime)

# python3, jq: the dataset's tasks run on the host in datasets/datasets_test.go.
APT_PACKAGES+=(python3 jq)

# Task images: the Debian base (mmdebstrap), Dockerfile builds (buildah), the local
# registry (docker-registry). See docs/images.md.
APT_PACKAGES+=(mmdebstrap buildah docker-registry)

# chromium: the web console's browser tests run it headless (docs/console.md).
APT_PACKAGES+=(chromium)

# zookeeper: replicated ClickHouse (pkg/zklocal, chlocal's replicated mode).
APT_PACKAGES+=(zookeeper)

# binary name, module path of its version, install path@version
GO_TOOLS=(
	"protoc-gen-go google.golang.org/protobuf google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.10"
	"protoc-gen-connect-go connectrpc.com/connect connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1"
	"protoc-gen-go-vtproto github.com/planetscale/vtprotobuf github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@v0.6.0"
	"staticcheck honnef.co/go/tools honnef.co/go/tools/cmd/staticcheck@v0.8.2"
	"temporal github.com/temporalio/cli github.com/temporalio/cli/cmd/temporal@v1.5.1"
	# The NATS server deploy/ ships (compose: nats:2.11): cmd/gauntlet's
	# TestStackOnTheDeployedNATS runs the stack against it; keep the two in step.
	"nats-server github.com/nats-io/nats-server/v2 github.com/nats-io/nats-server/v2@v2.11.17"
)

LOG="$(mktemp -t gauntlet-deps.XXXXXX)"
POLICY_RC=/usr/sbin/policy-rc.d
CREATED_POLICY_RC=0

cleanup() {
	rm -f "$LOG"
	if [[ $CREATED_POLICY_RC == 1 ]]; then
		rm -f "$POLICY_RC"
	fi
}
trap cleanup EXIT

die() {
	echo "deps.sh: $*" >&2
	exit 1
}

# run STEP CMD...: runs CMD with its output in $LOG; on failure prints the step and the
# tail of the output.
run() {
	local step=$1
	shift
	if ! "$@" >"$LOG" 2>&1; then
		echo "deps.sh: $step failed: $*" >&2
		echo "---- last 40 lines of output ----" >&2
		tail -n 40 "$LOG" >&2
		exit 1
	fi
}

# missing_apt prints the packages of APT_PACKAGES that are not installed, one per line.
missing_apt() {
	local installed
	installed="$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${APT_PACKAGES[@]}" 2>/dev/null || true)"
	local p
	for p in "${APT_PACKAGES[@]}"; do
		if ! grep -qx "$p installed" <<<"$installed"; then
			echo "$p"
		fi
	done
}

install_apt() {
	local missing
	mapfile -t missing < <(missing_apt)
	if ((${#missing[@]} == 0)); then
		return
	fi
	if ((EUID != 0)); then
		die "missing Debian packages (${missing[*]}); run this script as root to install them"
	fi
	command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian only"
	# The packages' postinsts would start a system-wide clickhouse-server on port 9000
	# and a system containerd; gauntlet runs its own (pkg/chlocal, pkg/ctrdlocal), so
	# forbid service starts during the install unless the machine already has a policy.
	if [[ ! -e $POLICY_RC ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC"
		chmod 0755 "$POLICY_RC"
		CREATED_POLICY_RC=1
	fi
	run "apt-get update" apt-get update
	run "apt-get install" apt-get install -y --no-install-recommends "${APT_PACKAGES[@]}"
	mapfile -t missing < <(missing_apt)
	if ((${#missing[@]} != 0)); then
		die "still missing after apt-get install: ${missing[*]}"
	fi
}

install_go_tools() {
	command -v go >/dev/null || die "go not found in PATH: install the Go toolchain named in go.mod first"
	local gopath bin
	gopath="$(go env GOPATH)"
	[[ -n $gopath ]] || die "go env GOPATH is empty"
	bin="${gopath%%:*}/bin"
	local entry name mod pkg want have
	for entry in "${GO_TOOLS[@]}"; do
		read -r name mod pkg <<<"$entry"
		want="${pkg##*@}"
		if [[ -x "$bin/$name" ]]; then
			# "go version -m" reads the module version embedded in the binary.
			have="$(go version -m "$bin/$name" 2>/dev/null | awk -v m="$mod" '$1 == "mod" && $2 == m { print $3 }')"
			if [[ $have == "$want" ]]; then
				continue
			fi
		fi
		run "go install $pkg" env GOBIN="$bin" go install "$pkg"
		[[ -x "$bin/$name" ]] || die "go install $pkg did not produce $bin/$name"
	done
}

install_apt
install_go_tools

# /dev/fuse for pkg/sandbox/faultfuse: load the module when the device is missing (a
# kernel with FUSE built in already has it; a container without it fails the tests that
# need it, saying so).
if [[ ! -e /dev/fuse ]]; then
	run "modprobe fuse" modprobe fuse
fi
