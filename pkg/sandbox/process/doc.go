//go:build linux

// Package process is the "process" sandbox runtime: every exec runs under
// bubblewrap in fresh mount, pid, network (loopback only), uts, ipc, cgroup and user
// namespaces, as an unprivileged host uid mapped to an unprivileged sandbox uid, with every
// capability dropped, no_new_privs and seccomp filters (bwrap's, and a per-exec
// notification filter of package safety that refuses and records hostile calls and egress
// attempts), inside the sandbox's cgroup
// (memory, pids and CPU limits; v1 and v2 hierarchies both supported and detected) and
// rlimits.
//
// A sandbox's workspace is an overlayfs whose upper layer lives on a tmpfs of its own
// (sized by Limits.DiskBytes) and whose lower layers are earlier snapshots. Snapshot
// freezes the upper layer as a new read-only lower layer and starts an empty upper one;
// Restore and Fork mount a fresh empty upper layer over a snapshot's layers. None of them
// copy file data, so their cost does not grow with the workspace's size.
//
// The root filesystem inside the sandbox is the host's /usr (read-only, with the usual
// /bin, /lib symlinks or binds), a synthetic /etc (passwd, group, hosts, resolv.conf and
// the host's ld.so and alternatives), a private /tmp, /proc and a minimal /dev (null,
// zero, full, random, urandom, tty; /dev/mem, /dev/kmem and /dev/port are empty decoys
// whose opens are recorded, package safety). Nothing else of the host is visible:
// not the state directory, not other sandboxes.
//
// State lives on disk under Config.StateDir (one JSON file per sandbox and per snapshot),
// so a new Runtime over the same directory lists and recovers what a previous worker
// process left. Sandboxes hold no processes between execs (each exec's pid namespace ends
// with its command), so recovery only re-attaches mounts and cgroups.
//
// A sandbox that declares services (Spec.Services) keeps one network namespace for its
// life instead, pinned under the state directory, which every exec joins and in which the
// host listens for the services (ListenService; see services.go and package svcnet).
//
// A Runtime is safe for concurrent use; execs of one sandbox are serialised so that its
// cgroup counters measure one command at a time. It runs one goroutine of its own, at
// times: the trimmer, which removes the emptied cgroups a drain kept beyond
// Config.CgroupPool once few sandboxes are left (Config.CgroupTrimBelow); Close stops
// it and removes what it left. The runtime needs root, bubblewrap,
// setpriv (util-linux), overlayfs, unprivileged user namespaces and the memory, pids and
// cpu cgroup controllers; New fails with sandbox.ErrUnavailable naming what is missing.
package process
