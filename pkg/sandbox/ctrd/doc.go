// Package ctrd is the containerd sandbox runtime: every sandbox is
// an OCI container (crun when installed, else runc, behind containerd's runc v2 shim)
// created through containerd's Go client, whose PID 1 is gauntlet's
// in-sandbox agent (package agent) serving execs over a unix socket bind-mounted from
// the runtime's state directory.
//
// Isolation per sandbox: its own mount, pid, network (loopback only: runc brings up
// lo in the new namespace and nothing else), uts and ipc namespaces; processes run as
// uid 0 of the container with every capability dropped (bounding set included),
// no_new_privs, containerd's default seccomp profile with the hostile calls of package
// safety left to the agent's notification filter (which refuses them with EPERM and
// records them, as it records egress attempts); the default /dev plus empty decoys at
// /dev/mem, /dev/kmem and /dev/port whose opens are recorded; cgroup limits on memory,
// pids and CPU (changeable while it runs: [Runtime.UpdateLimits]) and RLIMIT_NOFILE.
// On a cgroup v1 host those limits are on a child cgroup the commands run in, while the
// agent stays in the sandbox's cgroup above it with a reserve (cmdcgroup.go): a command
// that fills its memory is killed as a command, and the agent, which must answer for it,
// keeps memory and pids of its own. Every command the agent runs also gets the highest
// OOM score (1000) while the agent keeps 0.
//
// Workspace and snapshots: the workspace is /workspace in the container's writable
// overlayfs snapshot. [Runtime.Snapshot] freezes the container, copies that
// snapshot's upper directory (the changes since its parent) into a new snapshot on
// the same parent and commits it, held by a containerd lease named after the
// snapshot; [Runtime.Restore] replaces the container by one whose rootfs is a fresh
// active snapshot on top of the committed one (processes are stopped, as the
// interface says); [Runtime.Fork] creates a new sandbox the same way. DeleteSnapshot
// deletes the lease; containerd's garbage collector keeps a committed snapshot as
// long as a sandbox or a later snapshot sits on top of it. Snapshot chains are capped
// at MaxChain layers (ErrLimit beyond).
//
// Disk: each sandbox's writable layer (the overlay's upper and work directories, so
// /workspace and every other path it writes) is a tmpfs of Limits.DiskBytes of its own,
// mounted on the active snapshot's directory in the daemon's mount namespace before the
// task is created (quota.go): a write past the limit fails with ENOSPC inside the
// sandbox, the command that filled it gets a disk_full event, and no sandbox can fill
// the daemon's root (its metadata, the images, the other sandboxes' layers). What a
// sandbox writes is memory charged to its own memory cgroup, so it never touches the
// host's disk either; ctrdlocal.Options.RootTmpfsBytes keeps the root in memory too.
//
// Leftovers: Destroy of a sandbox this state directory knows but this instance never
// recovered (a crashed process's) tears it down all the same: task and processes,
// container, disk quota, rootfs snapshot, cgroups. List includes containers whose
// handle was never written, so that they can be destroyed.
//
// State: sandboxes are containers labelled with the runtime's state key (a hash of
// its state directory) in the runtime's containerd namespace; the handle of each,
// the agent socket directory and snapshot metadata live in the state directory. A
// new Runtime over the same state directory lists them (List) and re-attaches them
// (Recover) after a worker restart.
//
// Cold start: sandboxes share shims (up to Options.SandboxesPerShim per
// containerd-shim-runc-v2 process, through the shim's grouping annotation; see
// shimgroup.go), a sandbox joining a running shim is started by a small script instead
// of the shim binary's one-shot "start" command (shimstart.go), the task is created
// with the snapshot's mounts in one round trip, and with crun the seccomp profile is
// compiled once in Go and handed over precompiled (seccompbpf.go), so a start costs one
// /bin/sh, one crun create and start (crun runs from a read-only mount and need not copy
// itself: pkg/ctrdlocal), and the agent's own start.
//
// Streams and dials: [Runtime.ExecStream] hands the caller's pipes to the agent
// (agent.OpStream), which gives them to the command as its stdin and stdout, so a stdio
// server talks to the host with no copy in between; it holds the sandbox's op lock while
// it runs, as any exec. [Runtime.DialSandbox] connects to 127.0.0.1:port inside the
// task's network namespace, shared by every command of the sandbox, without that lock.
//
// Concurrency: a Runtime is safe for concurrent use. Operations on one sandbox are
// serialised (one exec at a time, which keeps per-exec metering exact); different
// sandboxes proceed in parallel.
package ctrd
