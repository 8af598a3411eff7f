// Package childproc runs gauntlet's local servers (ClickHouse in pkg/chlocal, containerd
// in pkg/ctrdlocal, the Temporal dev server in pkg/temporallocal) as child processes. A
// [Daemon] owns one server's lifecycle: spawning it in a process group of its own that
// dies with this program, waiting for its readiness probe within a bound, quoting the end
// of its log when it dies early, and stopping it gracefully then killing it. Each launcher
// supplies only its [Recipe]: the command, the files, the probe. The package also kills a
// server left over by a crashed earlier run through its pid file.
//
// A Daemon restarts nothing by itself: a [Supervisor] restarts a server that exited
// without being stopped, with bounded exponential backoff, and tells meanwhile why it is
// down, for readiness checks. Their methods are safe for concurrent use.
package childproc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// LeftoverGrace bounds how long KillLeftover waits for a killed leftover to exit.
const LeftoverGrace = 10 * time.Second

// KillLeftover reads the pid recorded in pidFile by an earlier run and, when that process
// still runs and owns says it is ours (pids are reused: owns checks its command line or
// name in /proc), kills it with SIGKILL and waits until it is gone. The pid file is removed
// in every case but a read error. name says what the process is, for logs and errors.
func KillLeftover(pidFile, name string, owns func(pid int) bool, log *slog.Logger) error {
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		log.Warn("ignoring malformed pid file", "process", name, "path", pidFile)
		return removePidFile(pidFile)
	}
	if owns(pid) {
		log.Warn("killing a server left over by an earlier run", "process", name, "pid", pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill leftover %s pid %d: %w", name, pid, err)
		}
		if err := WaitGone(pid, LeftoverGrace); err != nil {
			return fmt.Errorf("leftover %s: %w", name, err)
		}
	}
	return removePidFile(pidFile)
}

func removePidFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pid file: %w", err)
	}
	return nil
}

// CmdlineContains reports whether the running process pid has s in its command line.
func CmdlineContains(pid int, s string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(s))
}

// CommIs reports whether the running process pid is named comm (its /proc comm).
func CommIs(pid int, comm string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && string(bytes.TrimSpace(b)) == comm
}

// WaitGone waits until pid has exited, for at most bound. A zombie counts as gone once
// it is the last of its threads: it then holds no ports, files or memory, and only its
// parent can reap it. Its main thread alone being a zombie does not count: a
// multi-threaded server killed with SIGKILL passes through that state while its other
// threads still exit, holding its open files (ClickHouse's lock on its data directory).
func WaitGone(pid int, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || (IsZombie(stat) && lastThread(pid)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d still alive %v after SIGKILL", pid, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lastThread reports whether pid has no threads left but its main one.
func lastThread(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return err != nil || len(tasks) <= 1
}

// IsZombie reads the state field of a /proc/<pid>/stat line, which follows the command
// name in parentheses (a name that may itself hold parentheses and spaces).
func IsZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// FileSize is path's size, 0 when it does not exist: the offset from which Tail quotes
// what a server logs after it.
func FileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// Tail returns at most the last 20 lines (and 4 KiB) that path gained after offset,
// trimmed; "" when there are none or the file cannot be read.
func Tail(path string, offset int64) string {
	const maxBytes, maxLines = 4096, 20
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if fi.Size()-offset > maxBytes {
		offset = fi.Size() - maxBytes
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return string(bytes.TrimSpace(bytes.Join(lines, []byte("\n"))))
}

// StateDir is a launcher's Options.Dir made absolute, the directory that holds a server's
// files; empty is an error.
func StateDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("Options.Dir is empty")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("Options.Dir: %w", err)
	}
	return abs, nil
}
