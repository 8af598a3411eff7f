// Package ctrdlocal runs Debian's containerd (1.6) as a child process of the calling
// program, with its config, root, state, socket and log under one directory.
//
// It exists for development machines, CI and tests, where no service manager (no
// systemd) runs containerd: [Start] writes a config that enables only what gauntlet's
// containerd sandbox runtime uses (overlayfs snapshotter, the runc v2 shim; no CRI, no
// other snapshotters, no metrics or debug listeners), starts /usr/bin/containerd
// (scripts/deps.sh installs it with runc), and returns once the daemon answers a
// Version call on its socket. scripts/containerd.sh wraps the same code for people.
//
// Ownership: the [Server] owns the daemon process and everything under Options.Dir.
// Optionally (Options.RootTmpfsBytes) the daemon's root, where image content and
// overlayfs snapshots live, is a size-limited tmpfs mounted by Start: then every byte
// a container writes is memory, charged to that container's memory cgroup, so a
// sandbox that fills its disk hits its own memory limit and the host's disk is never
// touched. [Server.Stop] stops the daemon and unmounts that tmpfs; [Server.Kill]
// leaves the mount so [Server.Restart] finds the same state. Containers started
// through the daemon run under their own runc shims, which outlive the daemon (a
// restart keeps the containers): [Server.Purge] kills and deletes every task and
// container it knows, and owners call it before Stop; Stop then kills, with their
// containers' processes, the shims of the daemon still running. A pid file in Dir lets the next Start on the same Dir kill a daemon
// left behind by a crashed run; the daemon also dies with the program that started
// it (Linux parent-death signal). The process itself is a [childproc.Daemon]; this
// package is its recipe.
//
// The daemon runs in a mount namespace of its own, inherited by its shims and their OCI
// runtime; the host's mounts are untouched. In it, the OCI runtime binaries (crun, runc)
// are bind-mounted read-only onto themselves, so that crun need not copy itself to a
// read-only place on every call (its defence against a container overwriting it through
// /proc/PID/exe; the read-only mount is the same defence, made once). On a hybrid cgroup
// host whose cgroup2 hierarchy (/sys/fs/cgroup/unified) still offers controllers, crun
// refuses to create containers; there the namespace also lacks that cgroup2 mount.
// Cgroup limits are v1 either way.
//
// Concurrency: every method of Server is safe for concurrent use.
//
// Errors: Start fails with an error wrapping [ErrNotInstalled] when containerd or
// runc is missing, and with the tail of the daemon's log when it exits or does not
// answer in time. Every error names the operation that failed.
package ctrdlocal
