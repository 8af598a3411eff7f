package childproc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// shRecipe is a Recipe whose server is a shell script, ready once it has created the
// file "ready" in dir.
func shRecipe(dir, script string) Recipe {
	ready := filepath.Join(dir, "ready")
	return Recipe{
		Name: "sh",
		Command: func() (*exec.Cmd, error) {
			_ = os.Remove(ready)
			return exec.Command("/bin/sh", "-c", script, "sh", ready), nil
		},
		LogPath: filepath.Join(dir, "sh.log"),
		PidFile: filepath.Join(dir, "sh.pid"),
		OpenProbe: func() (Probe, func(), error) {
			return func(context.Context) error {
				_, err := os.Stat(ready)
				return err
			}, func() {}, nil
		},
		PollInterval: 5 * time.Millisecond,
		StartTimeout: 10 * time.Second,
		StopGrace:    10 * time.Second,
	}
}

func TestDaemonStartStopRestart(t *testing.T) {
	dir := t.TempDir()
	d := NewDaemon(shRecipe(dir, `touch "$1"; exec sleep 60`), nil)
	if d.Pid() != 0 || d.Done() != nil {
		t.Fatal("a daemon never started has a process")
	}
	ctx := context.Background()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	first := d.Pid()
	if first == 0 {
		t.Fatal("no pid after Start")
	}
	if err := d.Start(ctx); err == nil {
		t.Fatal("a second Start of a running daemon succeeded")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sh.pid")); err != nil || strings.TrimSpace(string(b)) == "" {
		t.Fatalf("pid file: %q, %v", b, err)
	}
	if err := d.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if d.Pid() == 0 || d.Pid() == first {
		t.Fatalf("pid after Restart = %d, first was %d", d.Pid(), first)
	}
	done := d.Done()
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Stop returned before the process exited")
	}
	if d.Pid() != 0 {
		t.Fatal("pid after Stop")
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := d.Kill(); err != nil {
		t.Fatalf("Kill of a stopped daemon: %v", err)
	}
}

func TestDaemonExitBeforeReadyQuotesLog(t *testing.T) {
	d := NewDaemon(shRecipe(t.TempDir(), `echo "cannot bind: address already in use" >&2; exit 3`), nil)
	err := d.Start(context.Background())
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("err = %v, want an ExitError", err)
	}
	if !strings.Contains(ee.Tail, "address already in use") {
		t.Fatalf("tail = %q", ee.Tail)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("err = %v, want exit status 3", err)
	}
}

func TestDaemonStartTimeoutKills(t *testing.T) {
	r := shRecipe(t.TempDir(), `echo still warming up; exec sleep 60`)
	r.StartTimeout = 100 * time.Millisecond
	d := NewDaemon(r, nil)
	err := d.Start(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still warming up") {
		t.Fatalf("err = %v, want a deadline with the log's tail", err)
	}
	if d.Pid() != 0 {
		t.Fatal("the server outlived its start timeout")
	}
}

func TestDaemonStopKillsAfterGrace(t *testing.T) {
	r := shRecipe(t.TempDir(), `trap '' TERM; touch "$1"; while :; do sleep 0.05; done`)
	r.StopGrace = 200 * time.Millisecond
	d := NewDaemon(r, nil)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d.Pid() != 0 {
		t.Fatal("the server survived Stop")
	}
	if took := time.Since(begin); took < r.StopGrace {
		t.Fatalf("Stop took %v, less than the grace it owes SIGTERM", took)
	}
}

func TestDaemonStartOnFreePortsPicksAgainWhenTaken(t *testing.T) {
	dir := t.TempDir()
	r := shRecipe(dir, "")
	picks := 0
	r.Command = func() (*exec.Cmd, error) {
		_ = os.Remove(filepath.Join(dir, "ready"))
		if picks == 1 { // the first pick's port was taken in between
			return exec.Command("/bin/sh", "-c", `echo "bind: address already in use" >&2; exit 1`), nil
		}
		return exec.Command("/bin/sh", "-c", `touch "$1"; exec sleep 60`, "sh", filepath.Join(dir, "ready")), nil
	}
	d := NewDaemon(r, nil)
	defer d.Kill()
	pick := func() error {
		ports, err := FreePorts(0, 0, 5)
		if err != nil {
			return err
		}
		if ports[0] == ports[1] || ports[2] != 5 {
			t.Errorf("FreePorts(0, 0, 5) = %v", ports)
		}
		picks++
		return nil
	}
	taken := func(ee *ExitError) bool { return strings.Contains(ee.Tail, "address already in use") }
	if err := d.StartOnFreePorts(context.Background(), 3, pick, taken); err != nil {
		t.Fatal(err)
	}
	if picks != 2 {
		t.Fatalf("picked %d times, want 2", picks)
	}
	// A failure taken does not recognise is returned at once.
	_ = d.Kill()
	picks = 0
	err := d.StartOnFreePorts(context.Background(), 3, pick, func(*ExitError) bool { return false })
	var ee *ExitError
	if !errors.As(err, &ee) || picks != 1 {
		t.Fatalf("err = %v after %d picks, want an ExitError after 1", err, picks)
	}
}
