//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/safety"
)

// drainGrace bounds how long output is still read after every process of a command
// is gone (they are all killed, so the pipes normally close at once).
const drainGrace = 100 * time.Millisecond

// Server runs commands for the runtime. Create it with NewServer and call Serve.
type Server struct {
	mu      sync.Mutex // held around fork+register so the reaper cannot lose a pid
	waiters map[int]chan syscall.WaitStatus
	// execMu runs commands one at a time: each ends by killing every other process in
	// the sandbox, so a command started while the previous one's cleanup runs (its caller
	// hung up and sent the next at once) would be killed with the leftovers.
	execMu sync.Mutex
	// rec collects what the seccomp supervisor refused; execs are serialised, so what
	// it holds at the end of one belongs to that command.
	rec *safety.Recorder
	// supervised is set once the notification filter is installed (see Serve).
	supervised bool
	// warm is closed once the prewarmed threads exist; commands wait for it.
	warm chan struct{}
	// spawn runs its functions on the spawner thread (see spawner); nil before Serve.
	spawn chan func()

	// PrewarmThreads is how many OS threads Serve has the Go runtime start and park for
	// later, while it already answers pings (see prewarmThreads); commands start only once
	// they exist. Set it before Serve.
	PrewarmThreads int
}

// NewServer returns a server.
func NewServer() *Server {
	return &Server{waiters: map[int]chan syscall.WaitStatus{}, rec: safety.NewRecorder(), warm: make(chan struct{})}
}

// Serve listens on socketPath (removing a stale socket first) and serves until ctx
// ends. It also reaps every child of the process, so it must run in PID 1 or a
// child subreaper, and nothing else in the process may wait for children.
func (s *Server) Serve(ctx context.Context, socketPath string) error {
	// The agent must not be readable or writable through /proc by the commands it
	// runs as the same uid.
	if err := setNotDumpable(); err != nil {
		return err
	}
	// Every thread of the agent, and so every command it starts, runs under the
	// notification filter; the agent answers hostile calls with EPERM and records them
	// (package safety). The agent itself makes none of those calls, so it never waits on
	// its own supervisor. Without the filter the agent refuses to serve: the container's
	// own profile leaves these calls to it.
	fd, err := safety.InstallFilter(true)
	if err != nil {
		return err
	}
	sup, err := safety.Supervise(fd, s.rec, true)
	if err != nil {
		return err
	}
	defer sup.Close()
	s.supervised = true
	// The spawner thread exists before the first ping is answered: the runtime may move
	// it (OpCgroup) as soon as the agent answers.
	ready := make(chan error, 1)
	s.spawn = make(chan func())
	go s.spawner(ready)
	if err := <-ready; err != nil {
		return err
	}
	_ = os.Remove(socketPath)
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	defer ln.Close()
	// The threads are made after the filter is installed (each inherits it from the thread
	// that creates it) and while the first ping is answered: a new sandbox is ready for
	// the runtime without waiting for them, and its first command waits instead (exec).
	go func() {
		prewarmThreads(s.PrewarmThreads)
		close(s.warm)
	}()
	go s.reap(ctx)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		go s.handle(conn)
	}
}

func (s *Server) handle(conn net.Conn) {
	defer conn.Close()
	// The first read takes the descriptors an OpStream request carries (CallStream);
	// the request is decoded from what it read and what follows.
	first, files, err := readFirst(conn)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var req Request
	if err == nil {
		err = json.NewDecoder(io.MultiReader(bytes.NewReader(first), conn)).Decode(&req)
	}
	if err != nil {
		_ = json.NewEncoder(conn).Encode(Response{Error: "decode request: " + err.Error()})
		return
	}
	var resp Response
	switch {
	case req.Op == OpPing:
	case req.Op == OpCgroup:
		resp.Error = s.joinCgroup(files)
	case req.Op == OpStream && len(files) != 2:
		resp.Error = fmt.Sprintf("op %q needs 2 descriptors (stdin, stdout) with the request; it came with %d", req.Op, len(files))
	case req.Op == OpExec || req.Op == OpStream:
		// The client sends nothing after its request: a read that returns means it
		// hung up (its context ended), and the command is killed.
		gone := make(chan struct{})
		go func() {
			var b [1]byte
			_, _ = conn.Read(b[:])
			close(gone)
		}()
		resp = s.exec(req, gone, files)
	default:
		resp.Error = fmt.Sprintf("op %q is not known", req.Op)
	}
	resp.Supervised = s.supervised
	_ = json.NewEncoder(conn).Encode(resp)
}

// maxFiles is the most descriptors a request may carry (OpStream's two, with room).
const maxFiles = 4

// readFirst reads the first bytes of a request together with the descriptors sent with
// them (received close-on-exec: no other command inherits them).
func readFirst(conn net.Conn) ([]byte, []*os.File, error) {
	buf := make([]byte, 4<<10)
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		n, err := conn.Read(buf)
		return buf[:n], nil, err
	}
	oob := make([]byte, syscall.CmsgSpace(maxFiles*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	var files []*os.File
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("control message: %w", err)
		}
		for _, m := range msgs {
			fds, err := syscall.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				// The host's pipes are non-blocking (Go's poller): a command reading one
				// as its stdin would see EAGAIN. The flag belongs to the pipe's open file
				// description, which the host shares; os/exec clears it in the same way.
				_ = syscall.SetNonblock(fd, false)
				files = append(files, os.NewFile(uintptr(fd), "stream"))
			}
		}
	}
	return buf[:n], files, nil
}

// reap waits for every child of the process and hands the statuses of registered
// commands to their waiters; orphans are reaped and dropped.
func (s *Server) reap(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid > 0 {
			s.mu.Lock()
			ch, ok := s.waiters[pid]
			delete(s.waiters, pid)
			s.mu.Unlock()
			if ok {
				ch <- ws
			}
			continue
		}
		select {
		case <-sigs:
		case <-time.After(time.Second): // a lost SIGCHLD never strands a zombie for long
		case <-ctx.Done():
			return
		}
	}
}

// capped keeps the first limit bytes written to it and counts them all.
type capped struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int64
	total int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	keep := int64(len(p))
	if c.limit > 0 {
		keep = min(keep, max(0, c.limit-int64(c.buf.Len())))
	}
	c.buf.Write(p[:keep])
	return len(p), nil
}

func (c *capped) result() ([]byte, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes()), c.total, c.limit > 0 && c.total > c.limit
}

// exec runs req's command. With OpStream, files are the command's stdin and stdout
// (the caller closes them once exec returns: the command has its own copies).
func (s *Server) exec(req Request, gone <-chan struct{}, files []*os.File) Response {
	if len(req.Argv) == 0 {
		return Response{Error: "argv is empty"}
	}
	stream := req.Op == OpStream
	s.execMu.Lock()
	defer s.execMu.Unlock()
	<-s.warm
	_ = s.rec.Drain() // nothing runs between commands; start from an empty record
	_, _ = s.rec.DrainEgress()
	outR, outW, err := os.Pipe()
	if err != nil {
		return Response{Error: "pipe: " + err.Error()}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return Response{Error: "pipe: " + err.Error()}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return Response{Error: "pipe: " + err.Error()}
	}
	dir := req.Dir
	if dir == "" {
		dir = "/"
	}

	lastPid0 := lastPid()
	io0 := selfIO()
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru0)

	prog, err := lookPath(req.Argv[0], req.Env)
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return Response{ExitCode: 127, Stderr: []byte(fmt.Sprintf("%s: %v\n", req.Argv[0], err))}
	}
	stdio := []uintptr{inR.Fd(), outW.Fd(), errW.Fd()}
	if stream {
		stdio[0], stdio[1] = files[0].Fd(), files[1].Fd()
	}
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   req.Env,
		Files: stdio,
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	done := make(chan syscall.WaitStatus, 1)
	began := time.Now()
	pid, err := s.fork(prog, req.Argv, attr, done)
	if err == nil {
		// Commands are the OOM killer's first choice, never the agent. Raising a
		// score needs no privilege; the command has only just exec'd.
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("1000"), 0)
	}
	inR.Close()
	outW.Close()
	errW.Close()
	for _, f := range files {
		// The command holds its own copies: a reader of its stdout sees the end once it
		// exits, not once the agent lets go.
		f.Close()
	}
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		code := 126
		if errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		return Response{ExitCode: code, Stderr: []byte(fmt.Sprintf("%s: %v\n", req.Argv[0], err))}
	}

	stdout := &capped{limit: req.OutputLimit}
	stderr := &capped{limit: req.OutputLimit}
	var readers sync.WaitGroup
	for _, p := range []struct {
		r *os.File
		w io.Writer
	}{{outR, stdout}, {errR, stderr}} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			_, _ = io.Copy(p.w, p.r)
		}()
	}
	var stdinWritten int64
	var writer sync.WaitGroup
	var closeIn sync.Once
	writer.Add(1)
	go func() {
		defer writer.Done()
		if stream {
			return // the command reads the caller's stdin; this pipe is not its
		}
		n, _ := inW.Write(req.Stdin)
		stdinWritten = int64(n)
		closeIn.Do(func() { inW.Close() })
	}()

	var timeout <-chan time.Time
	if req.TimeoutNS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutNS))
		defer t.Stop()
		timeout = t.C
	}
	var ws syscall.WaitStatus
	timedOut := false
	select {
	case ws = <-done:
	case <-timeout:
		timedOut = true
		_ = syscall.Kill(-1, syscall.SIGKILL)
		ws = <-done
	case <-gone:
		_ = syscall.Kill(-1, syscall.SIGKILL)
		ws = <-done
	}
	wall := time.Since(began)
	// Nothing survives a command: what it left in the background, in new sessions
	// or process groups, is killed (kill(-1) from PID 1 reaches every process of the
	// namespace but the agent) and reaped before the next command, so every command
	// starts clean and its measurements are complete.
	killOthers(5 * time.Second)
	_ = outR.SetReadDeadline(time.Now().Add(drainGrace))
	_ = errR.SetReadDeadline(time.Now().Add(drainGrace))
	readers.Wait()
	outR.Close()
	errR.Close()
	// A background process may hold stdin open without reading it: closing our end
	// unblocks a pending write.
	closeIn.Do(func() { inW.Close() })
	writer.Wait()

	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru1)
	io1 := selfIO()
	lastPid1 := lastPid()

	out, outTotal, outTrunc := stdout.result()
	errb, errTotal, errTrunc := stderr.result()
	resp := Response{
		Stdout:       out,
		Stderr:       errb,
		Truncated:    outTrunc || errTrunc,
		TimedOut:     timedOut,
		WallNS:       int64(wall),
		CPUNS:        rusageNS(ru1) - rusageNS(ru0),
		Processes:    max(0, lastPid1-lastPid0),
		BytesRead:    max(0, io1.rchar-io0.rchar-outTotal-errTotal),
		BytesWritten: max(0, io1.wchar-io0.wchar-stdinWritten),
		// Every process of the command is reaped: what the supervisor refused is final.
		Events: s.rec.Drain(),
	}
	resp.Egress, resp.EgressDropped = s.rec.DrainEgress()
	switch {
	case ws.Exited():
		resp.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		resp.ExitCode = 128 + int(ws.Signal())
	default:
		resp.ExitCode = 128 + int(syscall.SIGKILL)
	}
	return resp
}

// SpawnerThreadName is the name (comm, as ps shows it) of the agent's thread that starts
// every command. The runtime has it move itself, alone, into the cgroup that carries the
// commands' limits (OpCgroup; cgroup v1 places threads one by one), so every command
// starts there while the agent's other threads, and the memory the agent charges, stay in
// the sandbox's cgroup, which keeps a reserve for the agent above the commands' limit.
const SpawnerThreadName = "gauntlet-spawn"

// spawner locks its goroutine to an OS thread for good, names the thread
// SpawnerThreadName and runs the functions sent on s.spawn there. The Go runtime never
// starts a new thread from a locked one (it asks its template thread instead), so no
// thread of the agent is ever cloned from this one into the commands' cgroup.
func (s *Server) spawner(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread is the spawner's for the agent's life
	name := append([]byte(SpawnerThreadName), 0)
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0); errno != 0 {
		ready <- fmt.Errorf("name the spawner thread: %w", errno)
		return
	}
	ready <- nil
	for f := range s.spawn {
		f()
	}
}

// joinCgroup has the spawner thread write "0" to each tasks file of files (OpCgroup),
// between commands.
func (s *Server) joinCgroup(files []*os.File) string {
	if len(files) == 0 {
		return "op \"cgroup\" needs the tasks files with the request; it came with none"
	}
	if s.spawn == nil {
		return "no spawner thread"
	}
	s.execMu.Lock()
	defer s.execMu.Unlock()
	errs := make(chan error, 1)
	s.spawn <- func() {
		for _, f := range files {
			// Written on this thread, which the goroutine is locked to: "0" is this thread.
			if _, err := syscall.Write(int(f.Fd()), []byte("0")); err != nil {
				errs <- fmt.Errorf("write 0 to tasks file %d: %w", f.Fd(), err)
				return
			}
		}
		errs <- nil
	}
	if err := <-errs; err != nil {
		return err.Error()
	}
	return ""
}

// fork starts prog on the spawner thread (inline before Serve made it) and registers
// done as its waiter under s.mu, so the reaper cannot lose its pid.
func (s *Server) fork(prog string, argv []string, attr *syscall.ProcAttr, done chan syscall.WaitStatus) (int, error) {
	var pid int
	var err error
	run := func() {
		s.mu.Lock()
		pid, err = syscall.ForkExec(prog, argv, attr)
		if err == nil {
			s.waiters[pid] = done
		}
		s.mu.Unlock()
	}
	if s.spawn == nil {
		run()
		return pid, err
	}
	finished := make(chan struct{})
	s.spawn <- func() {
		run()
		close(finished)
	}
	<-finished
	return pid, err
}

// prewarmThreads makes the Go runtime start n OS threads now and keep them idle for later.
// A command that fills the sandbox's pids limit (a fork bomb) leaves no room for a new
// thread, and a Go program that cannot create one when a goroutine blocks in a system call
// dies: the agent would die with the sandbox it is meant to clean up. Threads made at start,
// while the limit has room, are parked by the runtime and reused instead.
func prewarmThreads(n int) {
	var started, done sync.WaitGroup
	release := make(chan struct{})
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread() // this goroutine now owns a thread of its own
			started.Done()
			<-release
			runtime.UnlockOSThread() // the thread goes back to the runtime's idle list
		}()
	}
	// Every goroutine holds a thread of its own at once: n threads exist.
	started.Wait()
	close(release)
	done.Wait()
}

// killOthers kills every process in the sandbox but the agent, again and again (a
// fork racing a kill is caught by the next round), until the agent is the only
// process left and everything is reaped, or bound passes.
func killOthers(bound time.Duration) {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		others := 0
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() {
				others++
			}
		}
		if others == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func rusageNS(ru syscall.Rusage) int64 {
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// lastPid is the last pid the sandbox's pid namespace handed out.
func lastPid() int64 {
	b, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

type ioCounters struct{ rchar, wchar int64 }

// selfIO reads the agent's rchar and wchar, which include reaped children's.
func selfIO() ioCounters {
	var c ioCounters
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return c
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "rchar":
			c.rchar = n
		case "wchar":
			c.wchar = n
		}
	}
	return c
}

func setNotDumpable() error {
	const prSetDumpable = 4
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}

// lookPath finds name in the PATH of env, as a shell would.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("command not found")
}
