package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd/agent"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/safety"
)

// Exec implements sandbox.Runtime: the command runs through the sandbox's agent;
// memory peak, OOM kills and pids-limit hits are read from the sandbox's cgroup
// around it.
func (r *Runtime) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return r.exec(ctx, "exec", id, req, nil, nil)
}

var _ sandbox.Streamer = (*Runtime)(nil)

// ExecStream implements sandbox.Streamer: Exec whose command's stdin and stdout are
// the caller's streams. The agent is handed the descriptors themselves (agent.OpStream),
// so an *os.File (a pipe, say) reaches the command with no copy on either side; another
// reader or writer goes through a pipe the runtime copies.
func (r *Runtime) ExecStream(ctx context.Context, id string, req sandbox.ExecRequest, stdin io.Reader, stdout io.Writer) (sandbox.ExecResult, error) {
	if stdin == nil || stdout == nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec stream %s: %w: stdin and stdout are required", id, sandbox.ErrInvalid)
	}
	in, ok := stdin.(*os.File)
	if !ok {
		pr, pw, err := os.Pipe()
		if err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("exec stream %s: %w", id, err)
		}
		defer pr.Close()
		// The copy ends when stdin does, or, once the command is gone, at its next
		// write (the pipe's reader closed); like os/exec, Exec does not wait for it.
		go func() {
			_, _ = io.Copy(pw, stdin)
			pw.Close()
		}()
		in = pr
	}
	out, ok := stdout.(*os.File)
	if !ok {
		pr, pw, err := os.Pipe()
		if err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("exec stream %s: %w", id, err)
		}
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			_, _ = io.Copy(stdout, pr)
		}()
		defer func() {
			pw.Close() // the command's copies are gone: the copy reads to the end
			<-copied
			pr.Close()
		}()
		out = pw
	}
	return r.exec(ctx, "exec stream", id, req, in, out)
}

// exec runs one command through the agent: with stdin and stdout set, as an
// agent.OpStream whose command gets them as its own.
func (r *Runtime) exec(ctx context.Context, op, id string, req sandbox.ExecRequest, stdin, stdout *os.File) (sandbox.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, err)
	}
	b, err := r.get(op, id)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone {
		return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrNotFound)
	}
	if r.isClosed() {
		return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, sandbox.ErrClosed)
	}
	if b.st.CommandCgroup && !b.placed {
		// A recovered sandbox, or one started without waiting for its agent.
		if err := r.placeCommands(ctx, b); err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, err)
		}
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = sandbox.DefaultExecTimeout
	}
	limit := req.OutputLimit
	if limit == 0 {
		limit = sandbox.DefaultOutputLimit
	}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + sandbox.WorkspacePath, "LANG=C.UTF-8"}, append(sandbox.ServiceEnv(b.handle.Spec.Services), b.handle.Spec.Env...)...)
	env = mergeEnv(append(env, req.Env...))

	trip, err := safety.WatchDecoys(r.decoyDir(id))
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, err)
	}
	defer trip.Close()
	// The storage-fault layer, when attached, is the command's workspace for its span.
	if b.fuse != nil {
		if err := b.fuse.Begin(); err != nil {
			return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, err)
		}
		defer func() {
			r.waitIdle(b) // the layer closes once the command's processes are gone
			if err := b.fuse.End(); err != nil {
				r.log.Warn("close storage fault layer", "sandbox", id, "err", err)
			}
		}()
	}
	cg := r.cgroup(b)
	before := cg.counters()
	cg.resetPeak()
	areq := agent.Request{
		Op:          agent.OpExec,
		Argv:        req.Argv,
		Env:         env,
		Dir:         sandbox.ExecDir(req.Dir),
		Stdin:       req.Stdin,
		TimeoutNS:   int64(timeout),
		OutputLimit: limit,
	}
	var resp agent.Response
	if stdin != nil {
		areq.Stdin = nil
		resp, err = agent.CallStream(ctx, r.socketPath(id), areq, stdin, stdout)
	} else {
		resp, err = agent.Call(ctx, r.socketPath(id), areq)
	}
	if err != nil {
		if ctx.Err() != nil {
			// The agent kills the command when the connection drops; wait for that so
			// the next exec starts clean.
			r.waitIdle(b)
			return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, ctx.Err())
		}
		return sandbox.ExecResult{}, fmt.Errorf("%s %s: %w", op, id, err)
	}
	after := cg.counters()
	res := sandbox.ExecResult{
		ExitCode:  resp.ExitCode,
		Stdout:    resp.Stdout,
		Stderr:    resp.Stderr,
		Truncated: resp.Truncated,
		TimedOut:  resp.TimedOut,
		Metering: sandbox.Metering{
			CPUTime:         time.Duration(resp.CPUNS),
			PeakMemoryBytes: cg.peak(),
			WallTime:        time.Duration(resp.WallNS),
			Processes:       resp.Processes,
			BytesRead:       resp.BytesRead,
			BytesWritten:    resp.BytesWritten,
		},
	}
	if resp.TimedOut {
		res.Events = append(res.Events, sandbox.Event{Kind: sandbox.EventTimeout, Detail: fmt.Sprintf("killed after %v", timeout)})
	}
	if n := after.oomKills - before.oomKills; n > 0 {
		res.Events = append(res.Events, sandbox.Event{Kind: sandbox.EventOOMKill, Detail: fmt.Sprintf("%d process(es) killed at the memory limit of %d bytes", n, b.handle.Spec.Limits.MemoryBytes)})
	}
	if n := after.pidsMax - before.pidsMax; n > 0 {
		res.Events = append(res.Events, sandbox.Event{Kind: sandbox.EventPidsLimit, Detail: fmt.Sprintf("pids limit %d reached %d times", b.handle.Spec.Limits.Pids, n)})
	}
	if n := after.throttled - before.throttled; n > 0 {
		res.Events = append(res.Events, sandbox.Event{Kind: sandbox.EventCPUThrottled, Detail: fmt.Sprintf("CPU quota of %d millicores throttled %d periods", b.handle.Spec.Limits.CPUMillis, n)})
	}
	if resp.Truncated {
		res.Events = append(res.Events, sandbox.Event{Kind: sandbox.EventOutputCapped, Detail: fmt.Sprintf("output beyond %d bytes dropped", limit)})
	}
	if b.quota != nil && b.quota.full() {
		res.Events = append(res.Events, sandbox.Event{Kind: sandbox.EventDiskFull, Detail: fmt.Sprintf("workspace reached its %d-byte limit", b.handle.Spec.Limits.DiskBytes)})
	}
	res.Events = append(res.Events, resp.Events...)
	res.Events = append(res.Events, trip.Events()...)
	res.Egress, res.EgressDropped = resp.Egress, resp.EgressDropped
	b.statMu.Lock()
	b.execs++
	b.total.Add(res.Metering)
	b.statMu.Unlock()
	return res, nil
}

// waitIdle waits briefly until only the agent is left in the sandbox.
func (r *Runtime) waitIdle(b *box) {
	cg := r.cgroup(b)
	for i := 0; i < 1000 && cg.pids() > 1; i++ {
		time.Sleep(5 * time.Millisecond)
	}
}

// mergeEnv keeps the last entry of each key, in first-seen order.
func mergeEnv(env []string) []string {
	idx := map[string]int{}
	var out []string
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := idx[k]; ok {
			out[i] = e
			continue
		}
		idx[k] = len(out)
		out = append(out, e)
	}
	return out
}

// Stats implements sandbox.Runtime. Pids and MemoryBytes leave out nothing: the
// agent is one process and a few MiB of them; Pids counts the sandbox's processes
// without the agent.
func (r *Runtime) Stats(ctx context.Context, id string) (sandbox.Stats, error) {
	b, err := r.get("stats", id)
	if err != nil {
		return sandbox.Stats{}, err
	}
	cg := r.cgroup(b)
	st := sandbox.Stats{MemoryBytes: cg.memory(), Pids: max(0, cg.pids()-1)}
	b.op.Lock()
	dir, err := r.workspaceDir(b)
	b.op.Unlock()
	if err == nil {
		st.WorkspaceBytes = dirSize(dir)
	}
	b.statMu.Lock()
	st.Execs, st.Total = b.execs, b.total
	b.statMu.Unlock()
	return st, nil
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// cgroupFiles reads a sandbox's cgroup from the host, v1 or v2. What one command did
// (its OOM kills, refused forks, throttling, memory peak) is read from the cgroup the
// commands run in: cmds/ when they have one (cmdcgroup.go), else the sandbox's.
type cgroupFiles struct {
	v2   bool
	path string // cgroupfs path below the hierarchy root
	cmds bool   // the commands run in cmds/ below path
}

type cgCounters struct {
	oomKills, pidsMax, throttled int64
}

func (r *Runtime) cgroup(b *box) cgroupFiles {
	return cgroupFiles{v2: r.cgroupV2, path: r.cgroupPath(b.handle.ID), cmds: b.st.CommandCgroup}
}

func (c cgroupFiles) file(controller, name string) string {
	if c.v2 {
		return filepath.Join("/sys/fs/cgroup", c.path, name)
	}
	return filepath.Join("/sys/fs/cgroup", controller, c.path, name)
}

// cmdFile is file name of the cgroup the commands run in.
func (c cgroupFiles) cmdFile(controller, name string) string {
	if c.cmds {
		return c.file(controller, cmdsCgroup+"/"+name)
	}
	return c.file(controller, name)
}

func (c cgroupFiles) counters() cgCounters {
	var k cgCounters
	if c.v2 {
		k.oomKills = keyed(c.cmdFile("", "memory.events"), "oom_kill")
		k.throttled = keyed(c.cmdFile("", "cpu.stat"), "nr_throttled")
	} else {
		k.oomKills = keyed(c.cmdFile("memory", "memory.oom_control"), "oom_kill")
		k.throttled = keyed(c.cmdFile("cpu", "cpu.stat"), "nr_throttled")
	}
	k.pidsMax = keyed(c.cmdFile("pids", "pids.events"), "max")
	return k
}

// resetPeak restarts the memory high-water mark so peak() covers one exec.
func (c cgroupFiles) resetPeak() {
	if c.v2 {
		_ = os.WriteFile(c.cmdFile("", "memory.peak"), []byte("0"), 0)
		return
	}
	_ = os.WriteFile(c.cmdFile("memory", "memory.max_usage_in_bytes"), []byte("0"), 0)
}

func (c cgroupFiles) peak() int64 {
	if c.v2 {
		return single(c.cmdFile("", "memory.peak"))
	}
	return single(c.cmdFile("memory", "memory.max_usage_in_bytes"))
}

func (c cgroupFiles) memory() int64 {
	if c.v2 {
		return single(c.file("", "memory.current"))
	}
	return single(c.file("memory", "memory.usage_in_bytes"))
}

// pids counts the processes (not threads) in the sandbox's cgroup and the commands'. A
// v1 cgroup.procs lists every process with a thread in that cgroup: the agent shows in
// both (its spawner thread is in the commands'), and is counted once.
func (c cgroupFiles) pids() int64 {
	own := procsIn(c.file("pids", "cgroup.procs"))
	if !c.cmds {
		return int64(len(own))
	}
	n := int64(len(own))
	for _, p := range procsIn(c.cmdFile("pids", "cgroup.procs")) {
		if !slices.Contains(own, p) {
			n++
		}
	}
	return n
}

// procsIn lists the pids in a cgroup.procs file.
func procsIn(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// single reads a file holding one number.
func single(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// keyed reads the value of "key N" from a flat-keyed cgroup file.
func keyed(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

var errChainTooLong = errors.New("snapshot chain too long")
