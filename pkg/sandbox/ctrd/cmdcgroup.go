package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd/agent"
)

// The commands' cgroup (cgroup v1 hosts).
//
// A sandbox's cgroup holds its agent and the commands it runs. Were the limits on that
// cgroup alone, a command filling the memory limit would leave the agent none: under that
// pressure the Go runtime's next thread or the agent's next allocation fails, the agent
// dies and the episode becomes an infra error instead of the command's failure. So the
// commands run in a child cgroup, cmds/, that carries the sandbox's memory, pids and CPU
// limits, and the sandbox's cgroup above it holds the agent with a reserve on top:
// agentMemoryReserve bytes and agentPidsReserve pids more than the commands get. What a
// command does to its own cgroup (OOM kills, refused forks, throttling) is what the exec
// reports, read from cmds/.
//
// cgroup v1 places threads one by one, which is how commands get there: the agent starts
// every command from one thread of its own (agent.SpawnerThreadName), which moves itself,
// and only itself, into cmds/ once the agent answers, through the tasks files the runtime
// opens and hands it (agent.JoinCgroup; the sandbox sees no cgroup file it could write).
// A thread moving itself is cheap; the runtime writing the thread's id would wait for an
// RCU grace period on every start (5-17 ms measured here). A child inherits the
// cgroups of the thread that forked it; the memory the agent itself uses is charged to its
// main thread's cgroup, the sandbox's. The OOM killer of cmds/ looks at whole processes
// there by their leading thread, so it never picks the agent for the spawner thread.
//
// cgroup v2 has no per-thread placement for the memory controller, and its rule that a
// cgroup with processes gives no controllers to its children would move the agent into a
// leaf of its own (agent/ beside cmds/) and start commands with clone3's
// CLONE_INTO_CGROUP. That shape is not built yet: on a v2 host a sandbox keeps one cgroup
// for the agent and its commands, as before.

// cmdsCgroup is the commands' cgroup below the sandbox's.
const cmdsCgroup = "cmds"

// agentMemoryReserve is the memory the sandbox's cgroup allows above the commands' limit,
// for the agent: its heap, stacks, the output it holds for a response (up to two capped
// buffers) and the page cache of its own binary.
const agentMemoryReserve = 32 << 20

// agentPidsReserve is the pids the sandbox's cgroup allows above the commands' limit: the
// agent's threads (PrewarmThreads and the Go runtime's own), with room.
const agentPidsReserve = 32

// cmdControllers are the v1 hierarchies cmds/ has a directory in.
var cmdControllers = []string{"memory", "pids", "cpu"}

// cmdsDir is cmds/ of sandbox id in v1 hierarchy controller.
func (r *Runtime) cmdsDir(controller, id string) string {
	return filepath.Join("/sys/fs/cgroup", controller, r.cgroupPath(id), cmdsCgroup)
}

// containerLimits are the limits of the sandbox's own cgroup: the commands' plus the
// agent's reserve when the commands have a cgroup of their own.
func containerLimits(l sandbox.Limits, cmds bool) sandbox.Limits {
	if cmds {
		if l.MemoryBytes > 0 {
			l.MemoryBytes += agentMemoryReserve
		}
		if l.Pids > 0 {
			l.Pids += agentPidsReserve
		}
	}
	return l
}

// placeCommands makes cmds/ of b with its limits and has the agent's spawner thread move
// into it (see the top of this file); every step is idempotent, so it runs again for a
// recovered sandbox.
func (r *Runtime) placeCommands(ctx context.Context, b *box) error {
	tasks, err := r.makeCommandCgroup(b)
	if err != nil {
		return err
	}
	return r.joinCommandCgroup(ctx, b, tasks)
}

// makeCommandCgroup makes cmds/ of b with its limits and opens its tasks files for
// joinCommandCgroup, which closes them. A start runs it while the agent starts.
func (r *Runtime) makeCommandCgroup(b *box) ([]*os.File, error) {
	id := b.handle.ID
	for _, c := range cmdControllers {
		if err := os.Mkdir(r.cmdsDir(c, id), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("commands' cgroup of %s: %w", id, err)
		}
	}
	if err := r.writeCommandLimits(id, b.handle.Spec.Limits); err != nil {
		return nil, err
	}
	var tasks []*os.File
	for _, c := range cmdControllers {
		f, err := os.OpenFile(filepath.Join(r.cmdsDir(c, id), "tasks"), os.O_WRONLY, 0)
		if err != nil {
			closeAll(tasks)
			return nil, fmt.Errorf("commands' cgroup of %s: %w", id, err)
		}
		tasks = append(tasks, f)
	}
	return tasks, nil
}

// joinCommandCgroup has b's agent move its spawner thread into cmds/ through tasks (from
// makeCommandCgroup), and closes them.
func (r *Runtime) joinCommandCgroup(ctx context.Context, b *box, tasks []*os.File) error {
	defer closeAll(tasks)
	ctx, cancel := context.WithTimeout(ctx, agentReadyTimeout)
	defer cancel()
	if err := agent.JoinCgroup(ctx, r.socketPath(b.handle.ID), tasks...); err != nil {
		return fmt.Errorf("commands' cgroup of %s: move the agent's spawner thread: %w", b.handle.ID, err)
	}
	b.placed = true
	return nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// writeCommandLimits writes the limits of l that are set into cmds/ of sandbox id. A
// child's CPU quota may not exceed its parent's, so the caller writes lowered limits before
// the parent's and raised ones after (splitLimits).
func (r *Runtime) writeCommandLimits(id string, l sandbox.Limits) error {
	var writes [][2]string
	if l.MemoryBytes > 0 {
		writes = append(writes, [2]string{filepath.Join(r.cmdsDir("memory", id), "memory.limit_in_bytes"), strconv.FormatInt(l.MemoryBytes, 10)})
	}
	if l.Pids > 0 {
		// The spawner thread is one of them: the commands get the whole limit.
		writes = append(writes, [2]string{filepath.Join(r.cmdsDir("pids", id), "pids.max"), strconv.FormatInt(l.Pids+1, 10)})
	}
	if l.CPUMillis > 0 {
		dir := r.cmdsDir("cpu", id)
		writes = append(writes,
			[2]string{filepath.Join(dir, "cpu.cfs_period_us"), "100000"},
			[2]string{filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(l.CPUMillis*100, 10)})
	}
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0); err != nil {
			return fmt.Errorf("commands' cgroup of %s: write %s to %s: %w", id, w[1], w[0], err)
		}
	}
	return nil
}

// splitLimits splits the memory, pids and CPU limits of next that change from cur into
// those it lowers and those it raises.
func splitLimits(next, cur sandbox.Limits) (down, up sandbox.Limits) {
	pick := func(n, c int64, d, u *int64) {
		switch {
		case n == 0 || n == c:
		case n < c:
			*d = n
		default:
			*u = n
		}
	}
	pick(next.MemoryBytes, cur.MemoryBytes, &down.MemoryBytes, &up.MemoryBytes)
	pick(next.Pids, cur.Pids, &down.Pids, &up.Pids)
	pick(next.CPUMillis, cur.CPUMillis, &down.CPUMillis, &up.CPUMillis)
	return down, up
}
