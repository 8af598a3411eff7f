package childproc

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
)

// Process is one run of a server binary started by Spawn.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // exit status, set before done is closed

	leaderOnly bool // Signal reaches the process itself, not its group
}

// Spawn starts cmd in a process group of its own (a terminal's Ctrl-C goes to us, not
// straight to the server) that dies with this program (other SysProcAttr flags of cmd
// are kept), its stdout and stderr appended to
// logPath, and records its pid in pidFile for KillLeftover; the pid file is removed when
// the process exits. name says what the process is, for logs and errors.
func Spawn(cmd *exec.Cmd, name, logPath, pidFile string, log *slog.Logger) (*Process, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	waited, err := StartLocked(cmd)
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("exec %s: %w", cmd.Path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	pid := strconv.Itoa(cmd.Process.Pid)
	if err := os.WriteFile(pidFile, []byte(pid+"\n"), 0o644); err != nil {
		log.Warn("pid file not written", "process", name, "path", pidFile, "err", err)
	}
	go func() {
		p.err = <-waited
		out.Close()
		if b, err := os.ReadFile(pidFile); err == nil && string(bytes.TrimSpace(b)) == pid {
			os.Remove(pidFile)
		}
		close(p.done)
	}()
	return p, nil
}

// StartLocked starts cmd from an OS thread locked to one goroutine until cmd has exited,
// and waits for it there; the returned channel gets Wait's result. Children started with
// Pdeathsig need it: the kernel sends that signal when the thread that forked the child
// ends, not when the process does, and Go ends a thread whose goroutine exits while locked
// to it, which packages safety and netns do on purpose (a thread carrying a seccomp filter
// or another namespace must not be reused). A server forked from whatever thread the
// runtime had at hand was killed by such an unrelated exit (a ClickHouse under the
// cmd/gauntlet tests, once the process runtime's supervisor threads came in).
func StartLocked(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waited, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the exit status; valid once Done is closed.
func (p *Process) Err() error { return p.err }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process's group (to the process alone when its Daemon's
// Recipe says SignalLeaderOnly). A nil or exited process is an error.
func (p *Process) Signal(sig syscall.Signal) error {
	if p == nil || p.Exited() {
		return errors.New("server is not running")
	}
	pid := p.Pid()
	target := -pid
	if p.leaderOnly {
		target = pid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("send %v to pid %d: %w", sig, pid, err)
	}
	return nil
}
