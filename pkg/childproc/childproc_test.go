package childproc

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestKillLeftoverKillsOnlyWhatItOwns(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "server.pid")

	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	pid := cmd.Process.Pid
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Not ours: left running, pid file removed.
	if err := KillLeftover(pidFile, "server", func(int) bool { return false }, log); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatal("a process the owner check refused was killed")
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Fatalf("pid file still there: %v", err)
	}

	// Ours (by command line): killed and gone.
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	owns := func(p int) bool { return CmdlineContains(p, "sleep") && CommIs(p, "sleep") }
	if err := KillLeftover(pidFile, "server", owns, log); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the leftover was not killed")
	}

	// Malformed and missing pid files are not errors.
	if err := os.WriteFile(pidFile, []byte("not a pid"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := KillLeftover(pidFile, "server", owns, log); err != nil {
		t.Fatalf("malformed pid file: %v", err)
	}
	if err := KillLeftover(pidFile, "server", owns, log); err != nil {
		t.Fatalf("missing pid file: %v", err)
	}
}

func TestIsZombie(t *testing.T) {
	for stat, want := range map[string]bool{
		"42 (clickhouse) S 1 42":      false,
		"42 (odd) name) Z 1 42":       true,
		"42 (a (b) c) R 1":            false,
		"42 (x) Z":                    true,
		"garbage without parenthesis": false,
	} {
		if got := IsZombie([]byte(stat)); got != want {
			t.Errorf("IsZombie(%q) = %v, want %v", stat, got, want)
		}
	}
}

func TestTailQuotesWhatTheLogGained(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	if err := os.WriteFile(path, []byte("old line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	at := FileSize(path)
	var b strings.Builder
	for i := range 30 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got := Tail(path, at)
	lines := strings.Split(got, "\n")
	if len(lines) != 20 || lines[0] != "line 10" || lines[19] != "line 29" {
		t.Fatalf("Tail = %q, want lines 10..29", got)
	}
	if Tail(filepath.Join(t.TempDir(), "missing"), 0) != "" || FileSize("/nonexistent/x") != 0 {
		t.Fatal("a missing log has an empty tail and size 0")
	}
}

// TestChildOutlivesLockedThreadExits starts a child with Pdeathsig through StartLocked,
// then ends many OS threads the way packages safety and netns do (a goroutine exits while
// locked to its thread). The child must live on: the thread that forked it is not among
// them.
func TestChildOutlivesLockedThreadExits(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	waited, err := StartLocked(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		select { // nothing to wait for when the test saw the child die
		case <-waited:
		case <-time.After(5 * time.Second):
		}
	}()
	for range 64 {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			close(done)
		}()
		<-done
	}
	time.Sleep(200 * time.Millisecond) // the kernel delivers Pdeathsig as a thread ends
	select {
	case err := <-waited:
		t.Fatalf("the child died when unrelated threads ended: %v", err)
	default:
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the child is gone: %v", err)
	}
}
