// Package agent is gauntlet's in-sandbox agent for the containerd runtime and the
// client the runtime talks to it with.
//
// The agent runs as PID 1 of every containerd sandbox (cmd/gauntlet-agent is its
// main). It listens on a unix socket in a directory the runtime bind-mounts from the
// host, and runs one command per connection: one JSON [Request] in, one JSON
// [Response] out. That is far quicker than a containerd task exec (a runc exec per
// command; docs/benchmarks.md, Costs the code cites, containerd sandboxes), which is why
// the runtime uses it for every Exec. A streaming exec (OpStream, the runtime's
// ExecStream: a stdio MCP server) sends two descriptors with its request (SCM_RIGHTS),
// the caller's pipes, which the command gets as its stdin and stdout: its bytes never
// pass through the agent, and the response comes once it exits.
//
// What the agent owns inside the sandbox:
//   - reaping: as PID 1 it reaps every process, orphans included, so the sandbox never
//     fills with zombies; a command's own exit status goes to the request that started it;
//   - cleanup: when a command exits, times out or its caller hangs up, the agent kills
//     every process in the sandbox but itself (kill(-1)) and reaps them, so nothing a
//     command started survives it and the next command starts clean;
//   - measuring: CPU time (rusage of reaped children), bytes read and written
//     (/proc/self/io, which the kernel credits with the I/O of reaped children, less
//     the agent's own pipe traffic) and processes spawned (the pid namespace's last
//     pid, which grows by one per process or thread);
//   - supervising system calls: at start it installs the seccomp notification filter of
//     package safety on all its threads, so every command inherits it; it answers
//     hostile calls (ptrace, mount, …) with EPERM and egress attempts with ENETUNREACH,
//     records them, and returns them with the command's [Response] (Events); a ping
//     reports Supervised, and it refuses to serve if the filter cannot be installed;
//   - where commands run: it starts every command from one thread of its own, locked
//     for good and named SpawnerThreadName, which the runtime has move itself into the
//     cgroup that carries the commands' limits (OpCgroup), so the agent keeps a reserve
//     above them in the sandbox's cgroup;
//   - its own safety: it raises every command's oom_score_adj to 1000 right after
//     starting it (raising needs no privilege; lowering the agent's own would need
//     CAP_SYS_RESOURCE), so the kernel's OOM killer picks commands, not the agent; it
//     runs with GOMAXPROCS 1 so its threads take few of the sandbox's pids, and starts
//     the spare threads it may need later (Server.PrewarmThreads) while it answers the
//     runtime's first ping, before any command runs (commands wait for them), so a fork
//     bomb that fills the pids limit cannot leave it without a thread; and it is not
//     dumpable, so a command running as the same uid cannot read or write its memory
//     through /proc.
//
// Requests on one agent are served concurrently but the runtime sends one at a time
// per sandbox, which keeps the per-command measurements exact. Errors inside the
// agent come back in Response.Error; a command that fails is a result, not an error.
package agent
