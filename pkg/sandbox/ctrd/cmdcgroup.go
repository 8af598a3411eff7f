package ctrd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
// every command from one thread of its own (agent.SpawnerThreadName), and the runtime
// moves that thread, and only it, into cmds/ once the agent answers. A child inherits the
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

// placeCommands makes cmds/ of b with its limits and moves the agent's spawner thread into
// it (see the top of this file); every step is idempotent, so it runs again for a
// recovered sandbox.
func (r *Runtime) placeCommands(b *box) error {
	id := b.handle.ID
	for _, c := range cmdControllers {
		if err := os.Mkdir(r.cmdsDir(c, id), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("commands' cgroup of %s: %w", id, err)
		}
	}
	if err := r.writeCommandLimits(id, b.handle.Spec.Limits); err != nil {
		return err
	}
	tid, err := spawnerTID(int(b.pid.Load()))
	if err != nil {
		return fmt.Errorf("commands' cgroup of %s: %w", id, err)
	}
	for _, c := range cmdControllers {
		if err := os.WriteFile(filepath.Join(r.cmdsDir(c, id), "tasks"), []byte(strconv.Itoa(tid)), 0); err != nil {
			return fmt.Errorf("commands' cgroup of %s: move the agent's spawner thread %d into %s: %w", id, tid, c, err)
		}
	}
	b.placed = true
	return nil
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

// spawnerTID finds the host tid of the agent's spawner thread among the threads of the
// agent, host pid pid.
func spawnerTID(pid int) (int, error) {
	if pid <= 0 {
		return 0, errors.New("the agent's pid is not known")
	}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("threads of the agent: %w", err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(b)) == agent.SpawnerThreadName {
			return strconv.Atoi(e.Name())
		}
	}
	return 0, fmt.Errorf("the agent (pid %d) has no thread named %s (an old agent in the image?)", pid, agent.SpawnerThreadName)
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
