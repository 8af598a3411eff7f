//go:build linux

package process

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/safety"
)

// baseEnv is every exec's environment before Spec.Env and ExecRequest.Env.
var baseEnv = []string{
	"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
	"HOME=" + sandbox.WorkspacePath,
	"LANG=C.UTF-8",
	"USER=sandbox",
	"TMPDIR=/tmp",
}

// innerScript runs as pid 1 of the sandbox's pid namespace (bwrap --as-pid-1: bwrap's own
// init would exit before it is reaped, orphaning a zombie to the host's init). It reports
// "s" on fd 4 as soon as the sandbox is set up (so a bwrap failure is told apart from a
// failing command) and waits on fd 5 until the runtime has read the cgroup's counters, so
// that metering covers the command and not the sandbox's setup. It then reports its
// /proc/self/io as a baseline, runs the command in a subshell with only fds 0-2 open (closed
// by exec there, so the shell keeps no saved copies the command could inherit; the init's
// own stderr goes to /dev/null so its "Killed" notices do not mix with the command's),
// and reports the
// namespace's last pid (the command and its descendants are pids 2…last) and its
// /proc/self/io again, which now includes every reaped descendant. When it exits, the
// kernel kills whatever is left in the namespace.
//
// The last pid is the fifth field of /proc/loadavg, which, like ns_last_pid, is of the
// reader's pid namespace. It is not read from /proc/sys/kernel/ns_last_pid: dash's read
// takes one byte per read(2) and a sysctl file answers nothing past offset 0, so from
// pid 10 on only the first digit came back (10 processes were metered as 0).
const innerScript = `echo s >&4
read a <&5
while read -r k v; do echo "0$k $v"; done < /proc/self/io >&4
exec 9>&2 2>/dev/null
(exec 2>&9 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; exec "$@")
rc=$?
read -r _ _ _ _ p < /proc/loadavg
echo "pids $p" >&4
while read -r k v; do echo "$k $v"; done < /proc/self/io >&4
exit $rc`

// Exec implements sandbox.Runtime.
func (r *Runtime) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec %s: %w", id, err)
	}
	b, err := r.lock("exec", id)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer b.mu.Unlock()
	res, err := r.exec(ctx, b, req, nil, nil)
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec %s: %w", id, err)
	}
	b.execs++
	b.total.Add(res.Metering)
	return res, nil
}

var _ sandbox.Streamer = (*Runtime)(nil)

// ExecStream implements sandbox.Streamer: Exec with the command's stdin and stdout
// connected to the caller's streams (an *os.File is handed to the command as it is,
// without a copying goroutine).
func (r *Runtime) ExecStream(ctx context.Context, id string, req sandbox.ExecRequest, stdin io.Reader, stdout io.Writer) (sandbox.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec stream %s: %w", id, err)
	}
	if stdin == nil || stdout == nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec stream %s: %w: stdin and stdout are required", id, sandbox.ErrInvalid)
	}
	b, err := r.lock("exec stream", id)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	defer b.mu.Unlock()
	res, err := r.exec(ctx, b, req, stdin, stdout)
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec stream %s: %w", id, err)
	}
	b.execs++
	b.total.Add(res.Metering)
	return res, nil
}

// exec runs one command in b, in four phases: prepare sets up what the command runs
// with (decoys, the storage-fault layer, the pipes to the launcher, the command line);
// start launches it from a thread carrying the notification filter; wait bounds it by its
// timeout and ctx and makes sure nothing of it survives; collect turns what the cgroup,
// the inner script and the safety watchers saw into the result.
//
// stdin and stdout, when set, are the command's streams (ExecStream) instead of req.Stdin
// and the captured output.
func (r *Runtime) exec(ctx context.Context, b *box, req sandbox.ExecRequest, stdin io.Reader, stdout io.Writer) (sandbox.ExecResult, error) {
	if err := ctx.Err(); err != nil {
		return sandbox.ExecResult{}, err
	}
	x := &execution{r: r, b: b, req: req, timeout: req.Timeout, limit: req.OutputLimit, spec: b.rec.Handle.Spec,
		closers: make([]func(), 0, 16), streamIn: stdin, streamOut: stdout}
	defer x.close()
	if err := x.prepare(); err != nil {
		return sandbox.ExecResult{}, err
	}
	if err := x.start(); err != nil {
		return sandbox.ExecResult{}, err
	}
	x.wait(ctx)
	return x.collect(ctx)
}

// execution is one exec's state across its phases. Fields written by the report reader
// (before, peak, cmdStart, report) are read only after repWG.Wait.
type execution struct {
	r       *Runtime
	b       *box
	req     sandbox.ExecRequest
	spec    sandbox.Spec
	timeout time.Duration
	limit   int64

	closers []func() // run in reverse order when the exec returns

	trip *safety.Tripwire
	rec  *safety.Recorder
	sup  atomic.Pointer[safety.Supervisor]

	// The launcher's pipes: fd 3 the seccomp program for bwrap, fd 4 the inner script's
	// report, fd 5 the go-ahead for the inner script once the counters are read, fd 6
	// bwrap's info (the host pid of the sandbox's init); fds 7… are /etc files.
	repR, repW   *os.File
	infoR, infoW *os.File
	ackR, ackW   *os.File

	cmd            *exec.Cmd
	stdout, stderr *capped
	// streamIn and streamOut replace req.Stdin and the captured stdout (ExecStream).
	streamIn  io.Reader
	streamOut io.Writer

	before   counters
	peak     *peakTracker
	began    time.Time // the exec's
	cmdStart time.Time // the command's, once the sandbox is set up
	end      time.Time
	report   []byte
	repWG    sync.WaitGroup
	initPid  atomic.Int64

	timedOut, cancelled atomic.Bool
	waitErr, killErr    error
}

// defers registers f to run when the exec returns, after those registered later.
func (x *execution) defers(f func()) { x.closers = append(x.closers, f) }

func (x *execution) close() {
	for i := len(x.closers) - 1; i >= 0; i-- {
		x.closers[i]()
	}
}

// pipe makes a pipe whose read end closes when the exec returns.
func (x *execution) pipe() (*os.File, *os.File, error) {
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	x.defers(func() { rd.Close() })
	return rd, wr, nil
}

// prepare sets up the decoy devices and their tripwire, the storage-fault layer, the
// pipes and /etc files handed to the launcher, and the command.
func (x *execution) prepare() error {
	r, b := x.r, x.b
	if x.timeout == 0 {
		x.timeout = sandbox.DefaultExecTimeout
	}
	if x.limit == 0 {
		x.limit = sandbox.DefaultOutputLimit
	}
	if err := b.ensureCPU(); err != nil {
		return err
	}

	// Decoy host devices, watched for the span of this exec (package safety).
	decoys := r.decoyDir(b.rec.Handle.ID)
	if err := safety.CreateDecoys(decoys); err != nil {
		return err
	}
	trip, err := safety.WatchDecoys(decoys)
	if err != nil {
		return err
	}
	x.trip = trip
	x.defers(func() { trip.Close() })
	// The storage-fault layer, when attached, is the command's workspace; it closes
	// once every process of the command is gone.
	ws, endFuse, err := r.beginFuse(b)
	if err != nil {
		return err
	}
	x.defers(endFuse)
	x.rec = safety.NewRecorder()

	secR, secW, err := x.pipe()
	if err != nil {
		return err
	}
	go func() {
		_, _ = secW.Write(r.seccomp)
		secW.Close()
	}()
	if x.repR, x.repW, err = x.pipe(); err != nil {
		return err
	}
	if x.infoR, x.infoW, err = x.pipe(); err != nil {
		return err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		return err
	}
	x.ackR, x.ackW = ackR, ackW
	x.defers(func() { ackW.Close() })
	x.defers(func() { ackR.Close() })
	files := []*os.File{secR, x.repW, ackR, x.infoW}
	for _, name := range etcFiles {
		file := r.etcFile(x.spec, name)
		if b.rec.User != nil && (name == "passwd" || name == "group") {
			file = r.userEtcPath(b.rec, name)
		}
		f, err := os.Open(file)
		if err != nil {
			return fmt.Errorf("open /etc/%s: %w", name, err)
		}
		x.defers(func() { f.Close() })
		files = append(files, f)
	}

	x.stdout = &capped{limit: x.limit}
	x.stderr = &capped{limit: x.limit}
	cmd := exec.Command(r.sh, r.args(b, x.req, x.spec, ws)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stdin = bytes.NewReader(x.req.Stdin)
	cmd.Stdout = x.stdout
	if x.streamIn != nil {
		cmd.Stdin, cmd.Stdout = x.streamIn, x.streamOut
	}
	cmd.Stderr = x.stderr
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second
	x.cmd = cmd
	return nil
}

// start reads the inner script's report and bwrap's info in the background and starts
// the command. The counters are read when the sandbox is set up and the command about to
// start; if it never gets that far, from the start of the exec.
func (x *execution) start() error {
	b := x.b
	x.before = b.cg.read()
	x.peak = b.cg.startPeak()
	x.repWG.Add(1)
	go func() {
		defer x.repWG.Done()
		var buf bytes.Buffer
		sc := bufio.NewScanner(x.repR)
		for sc.Scan() {
			if sc.Text() == "s" {
				// bwrap's set-up is done: from here on only the command can make a
				// hostile call.
				if s := x.sup.Load(); s != nil {
					s.Arm()
				}
				x.before = b.cg.read()
				x.peak.close()
				x.peak = b.cg.startPeak()
				x.cmdStart = time.Now()
				_, _ = x.ackW.WriteString("go\n")
				x.ackW.Close()
			}
			buf.Write(sc.Bytes())
			buf.WriteByte('\n')
		}
		x.report = buf.Bytes()
	}()

	go func() {
		var info struct {
			ChildPid int64 `json:"child-pid"`
		}
		if json.NewDecoder(x.infoR).Decode(&info) == nil {
			x.initPid.Store(info.ChildPid)
			if x.streamIn != nil {
				b.streamInit.Store(info.ChildPid)
			}
		}
		_, _ = io.Copy(io.Discard, x.infoR)
	}()

	// The command is started from an OS thread of its own that carries the notification
	// filter (package safety), so the launcher, bwrap, the sandbox's init and the command
	// inherit it and this exec's supervisor sees only this exec. The thread is never given
	// back (it ends with its goroutine) and lives until the command is reaped: Pdeathsig
	// fires when the thread that started the child exits.
	started := make(chan error, 1)
	release := make(chan struct{})
	x.defers(func() { close(release) })
	x.began = time.Now()
	go func() {
		runtime.LockOSThread()
		fd, err := safety.InstallFilter(false)
		if err == nil {
			var s *safety.Supervisor
			if s, err = safety.Supervise(fd, x.rec, false); err == nil {
				x.sup.Store(s)
				err = x.cmd.Start()
			}
		}
		started <- err
		<-release
	}()
	startErr := <-started
	if s := x.sup.Load(); s != nil {
		x.defers(s.Close)
	}
	x.repW.Close()
	x.infoW.Close()
	if startErr != nil {
		x.repWG.Wait()
		return fmt.Errorf("start: %w", startErr)
	}
	x.ackR.Close()
	return nil
}

// wait waits for the command, killing it at its timeout or when ctx ends, then makes
// sure nothing of it survives and the report is read.
//
// To stop a command, every process of the sandbox except bwrap (our child) and the
// sandbox's init (bwrap's child, the inner script) is killed, repeatedly until bwrap
// exits: the init then reports what it measured and exits, and bwrap reaps it, so no
// zombie is orphaned to the host's init (where it would count against the pids limit
// until reaped). If bwrap has not exited after two seconds everything is killed.
func (x *execution) wait(ctx context.Context) {
	cmd, b := x.cmd, x.b
	var finished atomic.Bool
	var killing sync.Once
	killAll := func() {
		killing.Do(func() {
			go func() {
				outer := cmd.Process.Pid
				deadline := time.Now().Add(2 * time.Second)
				for !finished.Load() {
					for _, p := range b.cg.procs() {
						if p != outer && ppid(p) != outer {
							_ = syscall.Kill(p, syscall.SIGKILL)
						}
					}
					if time.Now().After(deadline) {
						if p := x.initPid.Load(); p > 0 {
							_ = syscall.Kill(int(p), syscall.SIGKILL)
						}
						_ = cmd.Process.Kill()
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
		})
	}
	timer := time.AfterFunc(x.timeout, func() {
		x.timedOut.Store(true)
		killAll()
	})
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			x.cancelled.Store(true)
			killAll()
		case <-stop:
		}
	}()
	x.waitErr = cmd.Wait()
	finished.Store(true)
	b.streamInit.Store(0)
	x.end = time.Now()
	timer.Stop()
	close(stop)
	// The pid namespace ended with its init, but make sure: nothing survives an exec.
	x.killErr = b.cg.kill(5 * time.Second)
	x.repWG.Wait()
}

// collect builds the result: exit code, output, metering from the cgroup's counters and
// the inner script's report, and the events of limits hit and of refused attacks.
func (x *execution) collect(ctx context.Context) (sandbox.ExecResult, error) {
	r, b := x.r, x.b
	if x.cancelled.Load() && !x.timedOut.Load() {
		return sandbox.ExecResult{}, ctx.Err()
	}
	if x.killErr != nil {
		return sandbox.ExecResult{}, x.killErr
	}
	code, err := exitCode(x.cmd, x.waitErr)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	rep := parseReport(x.report)
	if !rep.started && !x.timedOut.Load() {
		return sandbox.ExecResult{}, fmt.Errorf("%w: sandbox setup failed (exit %d): %s",
			sandbox.ErrUnavailable, code, strings.TrimSpace(x.stderr.buf.String()))
	}
	after := b.cg.read()
	wall := x.end.Sub(x.began)
	if !x.cmdStart.IsZero() {
		wall = x.end.Sub(x.cmdStart)
	}
	stdout, stderr := x.stdout, x.stderr
	res := sandbox.ExecResult{
		ExitCode:  code,
		Stdout:    stdout.bytes(),
		Stderr:    stderr.bytes(),
		Truncated: stdout.dropped > 0 || stderr.dropped > 0,
		TimedOut:  x.timedOut.Load(),
		Metering: sandbox.Metering{
			CPUTime:         after.cpu - x.before.cpu,
			PeakMemoryBytes: x.peak.peak(),
			WallTime:        wall,
			Processes:       rep.processes,
			BytesRead:       rep.rchar,
			BytesWritten:    rep.wchar,
		},
	}
	ev := func(k sandbox.EventKind, format string, args ...any) {
		res.Events = append(res.Events, sandbox.Event{Kind: k, Detail: fmt.Sprintf(format, args...)})
	}
	before := x.before
	spec := x.spec
	spec.Limits = b.liveLimits(spec.Limits) // as UpdateLimits last set them
	if res.TimedOut {
		ev(sandbox.EventTimeout, "killed after %v", x.timeout)
	}
	if n := after.oomKills - before.oomKills; n > 0 {
		ev(sandbox.EventOOMKill, "%d process(es) killed at the %d-byte memory limit", n, spec.Limits.MemoryBytes)
	}
	if n := after.pidsMax - before.pidsMax; n > 0 {
		ev(sandbox.EventPidsLimit, "%d fork(s) refused at the limit of %d processes", n, spec.Limits.Pids)
	}
	if n := after.throttled - before.throttled; n > 0 {
		ev(sandbox.EventCPUThrottled, "throttled in %d period(s) at %d millicores", n, spec.Limits.CPUMillis)
	}
	if res.Truncated {
		ev(sandbox.EventOutputCapped, "dropped %d stdout and %d stderr bytes beyond %d", stdout.dropped, stderr.dropped, x.limit)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(r.volDir(b.rec.Volume), &st); err == nil && st.Bavail == 0 {
		ev(sandbox.EventDiskFull, "workspace reached its %d-byte limit", spec.Limits.DiskBytes)
	}
	// Every process of the exec is gone: what the supervisor and the tripwire saw is final.
	x.sup.Load().Close()
	res.Events = append(res.Events, x.rec.Drain()...)
	res.Egress, res.EgressDropped = x.rec.DrainEgress()
	res.Events = append(res.Events, x.trip.Events()...)
	return res, nil
}

// args builds: sh -c <join cgroup, rlimits> -- [nsenter --net=...] setpriv ... bwrap ... -- sh -c inner argv...
//
// ws is the host directory bound as the workspace: the overlay, or the storage-fault
// layer's mount when one is attached.
func (r *Runtime) args(b *box, req sandbox.ExecRequest, spec sandbox.Spec, ws string) []string {
	var outer strings.Builder
	for _, f := range b.cg.procsFiles() {
		fmt.Fprintf(&outer, "echo $$ > %s || exit 125\n", shQuote(f))
	}
	fmt.Fprintf(&outer, "ulimit -n %d || exit 125\nulimit -c 0\nexec \"$@\"\n", spec.Limits.OpenFiles)

	nsPrefix, bwrapNet := r.netArgs(spec)
	uid, gid := SandboxUID, SandboxGID
	if u := b.rec.User; u != nil {
		uid, gid = u.UID, u.GID
	}
	a := append([]string{"-c", outer.String(), "gauntlet-sandbox"}, nsPrefix...)
	a = append(a,
		r.cfg.Setpriv, "--reuid="+strconv.Itoa(r.cfg.HostUID), "--regid="+strconv.Itoa(r.cfg.HostGID),
		"--clear-groups", "--",
		r.cfg.Bwrap,
		"--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
		"--uid", strconv.Itoa(uid), "--gid", strconv.Itoa(gid),
		"--disable-userns", "--hostname", "sandbox",
		"--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL",
		"--seccomp", "3", "--info-fd", "6",
		"--clearenv",
	)
	a = append(a, bwrapNet...)
	env := map[string]string{}
	var order []string
	for _, list := range [][]string{baseEnv, sandbox.ServiceEnv(spec.Services), spec.Env, req.Env} {
		for _, e := range list {
			k, v, _ := strings.Cut(e, "=")
			if _, ok := env[k]; !ok {
				order = append(order, k)
			}
			env[k] = v
		}
	}
	for _, k := range order {
		a = append(a, "--setenv", k, env[k])
	}
	if b.rec.Root != "" {
		a = append(a, r.imageRootArgs(b.rec.Handle.ID)...)
	} else {
		a = append(a, r.rootfs...)
	}
	for _, d := range safety.DecoyDevices {
		a = append(a, "--ro-bind", filepath.Join(r.decoyDir(b.rec.Handle.ID), d), "/dev/"+d)
	}
	a = append(a,
		"--size", strconv.FormatInt(spec.Limits.DiskBytes, 10), "--tmpfs", "/tmp",
		"--bind", ws, sandbox.WorkspacePath,
	)
	if b.rec.Root == "" { // an image root's skeleton holds the links
		for _, l := range slices.Sorted(maps.Keys(spec.Links)) {
			a = append(a, "--symlink", path.Join(sandbox.WorkspacePath, spec.Links[l]), l)
		}
	}
	a = append(a,
		"--remount-ro", "/",
		"--chdir", sandbox.ExecDir(req.Dir),
		"--", "/bin/sh", "-c", innerScript, "sh",
	)
	return append(a, req.Argv...)
}

// rootfsArgs binds the host's /usr read-only and mirrors the host's /bin, /lib… layout.
func (r *Runtime) rootfsArgs() []string {
	a := []string{"--ro-bind", "/usr", "/usr"}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if t, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", t, d)
			}
		case fi.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	a = append(a, "--dir", "/etc")
	for _, f := range []string{"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime", "/etc/ssl"} {
		a = append(a, "--ro-bind-try", f, f)
	}
	for i, f := range etcFiles {
		a = append(a, "--ro-bind-data", strconv.Itoa(7+i), "/etc/"+f)
	}
	return append(a, "--proc", "/proc", "--dev", "/dev")
}

// decoyDir holds a sandbox's decoy devices (package safety), beside its workspace mount
// point so that the unprivileged launcher can reach them ("." never occurs in an id).
func (r *Runtime) decoyDir(id string) string { return filepath.Join(r.runDir, id+".decoy") }

// etcFiles are the synthetic /etc files, passed as fds 7, 8, … in this order.
var etcFiles = []string{"passwd", "group", "hosts", "nsswitch.conf", "resolv.conf"}

// writeEtc writes the sandbox's synthetic /etc files into the state directory.
func (r *Runtime) writeEtc() error {
	files := map[string]string{
		"passwd":        fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:sandbox:%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", SandboxUID, SandboxGID, sandbox.WorkspacePath),
		"group":         fmt.Sprintf("root:x:0:\nsandbox:x:%d:\nnogroup:x:65534:\n", SandboxGID),
		"hosts":         sandbox.HostsFile(),
		"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n", // with services: sandbox.NsswitchConf
		"resolv.conf":   sandbox.ResolvConf(),
	}
	for name, body := range files {
		if err := os.WriteFile(r.path("etc", name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	return nil
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// exitCode turns the wait result into a shell-style exit code.
func exitCode(cmd *exec.Cmd, waitErr error) (int, error) {
	var ee *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &ee) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return 0, fmt.Errorf("wait: %w", waitErr)
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return cmd.ProcessState.ExitCode(), nil
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}

type report struct {
	started      bool
	processes    int64
	rchar, wchar int64
}

func parseReport(b []byte) report {
	var rep report
	v := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, val, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		v[strings.TrimSuffix(k, ":")] = n
		if k == "s" {
			rep.started = true
		}
	}
	if p, ok := v["pids"]; ok {
		rep.processes = max(p-1, 0)
	}
	if r, ok := v["rchar"]; ok {
		rep.rchar = max(r-v["0rchar"], 0)
	}
	if w, ok := v["wchar"]; ok {
		rep.wchar = max(w-v["0wchar"], 0)
	}
	return rep
}

// capped keeps the first limit bytes written and counts the rest.
type capped struct {
	mu      sync.Mutex
	limit   int64
	buf     bytes.Buffer
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.limit - int64(c.buf.Len())
	if room >= int64(len(p)) {
		c.buf.Write(p)
		return len(p), nil
	}
	if room > 0 {
		c.buf.Write(p[:room])
	}
	c.dropped += int64(len(p)) - max(room, 0)
	return len(p), nil
}

func (c *capped) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

// ppid returns the parent pid of pid, or 0.
func ppid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}
