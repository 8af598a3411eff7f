package childproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startLog records when a Recipe's command was built, once per start.
type startLog struct {
	mu sync.Mutex
	at []time.Time
}

func (l *startLog) wrap(r Recipe) Recipe {
	cmd := r.Command
	r.Command = func() (*exec.Cmd, error) {
		l.mu.Lock()
		l.at = append(l.at, time.Now())
		l.mu.Unlock()
		return cmd()
	}
	return r
}

func (l *startLog) times() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.at...)
}

// runSupervisor runs s until the test ends; Run's error fails the test.
func runSupervisor(t *testing.T, s *Supervisor) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return cancel
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A server that keeps dying is restarted after waits that double from Initial up to Max,
// and each attempt is counted.
func TestSupervisorBacksOff(t *testing.T) {
	dir := t.TempDir()
	var starts startLog
	// Ready at once, then dead 30 ms later: a crash loop.
	d := NewDaemon(starts.wrap(shRecipe(dir, `touch "$1"; exec sleep 0.03`)), nil)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond, Stable: time.Hour}
	s := NewSupervisor(d, b)
	runSupervisor(t, s)
	const want = 7 // the first start and six restarts
	waitUntil(t, "six restarts", func() bool { return len(starts.times()) >= want })
	at := starts.times()
	wait := b.Initial
	for i := 1; i < want; i++ {
		gap := at[i].Sub(at[i-1])
		// A gap is the server's life (30 ms and its start) plus the wait.
		if gap < wait {
			t.Errorf("restart %d came %v after the start before it, under its backoff %v", i, gap, wait)
		}
		// Without the cap the sixth wait would be 640 ms.
		if i == want-1 && gap > 500*time.Millisecond {
			t.Errorf("restart %d came %v after the start before it: the backoff is not capped at %v", i, gap, b.Max)
		}
		wait = min(2*wait, b.Max)
	}
	// The count follows each attempt's end.
	waitUntil(t, "six restarts counted", func() bool { return s.Restarts() >= want-1 })
}

// A server killed with SIGKILL makes Ready say so, naming the server, until the
// restarted one runs; then Ready is nil again.
func TestSupervisorRestartsKilledServer(t *testing.T) {
	dir := t.TempDir()
	d := NewDaemon(shRecipe(dir, `touch "$1"; exec sleep 60`), nil)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	s := NewSupervisor(d, Backoff{Initial: 300 * time.Millisecond})
	runSupervisor(t, s)
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready of a running server: %v", err)
	}
	first := d.Pid()
	done := d.Done()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	if s.Ready() == nil {
		t.Fatal("Ready is nil once the killed server is reaped")
	}
	waitUntil(t, "Ready names the server and the crash", func() bool {
		err := s.Ready()
		return err != nil && strings.Contains(err.Error(), "sh exited unexpectedly (signal: killed); restart 1 in 300ms")
	})
	waitUntil(t, "the server is back", func() bool { return s.Ready() == nil })
	if p := d.Pid(); p == 0 || p == first {
		t.Fatalf("pid after the restart = %d, the killed one was %d", p, first)
	}
	if s.Restarts() != 1 {
		t.Errorf("Restarts() = %d, want 1", s.Restarts())
	}
}

// Stop is not a crash: the server stays down, and Ready says it is stopped, until its
// owner starts it again.
func TestSupervisorLeavesStoppedServer(t *testing.T) {
	dir := t.TempDir()
	var starts startLog
	d := NewDaemon(starts.wrap(shRecipe(dir, `touch "$1"; exec sleep 60`)), nil)
	ctx := context.Background()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(ctx) })
	s := NewSupervisor(d, Backoff{Initial: 10 * time.Millisecond})
	runSupervisor(t, s)
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(starts.times()); n != 1 || d.Pid() != 0 {
		t.Fatalf("after Stop: %d starts, pid %d; want the one start and no process", n, d.Pid())
	}
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Ready of a stopped server = %v", err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "Ready after the owner's Start", func() bool { return s.Ready() == nil })
	// Supervision goes on with the new process.
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the killed server is back", func() bool { return d.Pid() != 0 && s.Ready() == nil })
	if s.Restarts() != 1 {
		t.Errorf("Restarts() = %d, want 1 (the kill's)", s.Restarts())
	}
}

// Once Run's context has ended (the process is stopping), a crash is left alone.
func TestSupervisorStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	var starts startLog
	d := NewDaemon(starts.wrap(shRecipe(dir, `touch "$1"; exec sleep 60`)), nil)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	s := NewSupervisor(d, Backoff{Initial: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(starts.times()); n != 1 || s.Restarts() != 0 {
		t.Fatalf("%d starts, %d restarts after Run ended; want 1 and 0", n, s.Restarts())
	}
}

// A server that is alive but stops answering (SIGSTOP, as a hung server) makes Ready say
// so once two probes in a row go unanswered, and is killed and restarted once it has not answered
// for HungAfter.
func TestSupervisorRestartsHungServer(t *testing.T) {
	dir := t.TempDir()
	beat := filepath.Join(dir, "beat")
	r := shRecipe(dir, "")
	r.Command = func() (*exec.Cmd, error) {
		_ = os.Remove(filepath.Join(dir, "ready"))
		return exec.Command("/bin/sh", "-c", `touch "$1"; i=0; while :; do i=$((i+1)); echo $i > "$2"; sleep 0.01; done`, "sh", filepath.Join(dir, "ready"), beat), nil
	}
	// The server answers when its heartbeat moved since the last probe.
	var mu sync.Mutex // the start's probes and the Supervisor's may overlap
	var last string
	r.OpenProbe = func() (Probe, func(), error) {
		return func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			b, err := os.ReadFile(beat)
			if err != nil {
				return err
			}
			if string(b) == last {
				return fmt.Errorf("heartbeat still %q", strings.TrimSpace(last))
			}
			last = string(b)
			return nil
		}, func() {}, nil
	}
	d := NewDaemon(r, nil)
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	s := NewSupervisor(d, Backoff{Initial: 50 * time.Millisecond, ProbeEvery: 100 * time.Millisecond, HungAfter: time.Second})
	runSupervisor(t, s)
	waitUntil(t, "the server answers", func() bool { return s.Ready() == nil })
	first := d.Pid()
	if err := syscall.Kill(-first, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "Ready says the server does not answer", func() bool {
		err := s.Ready()
		return err != nil && strings.Contains(err.Error(), "sh does not answer")
	})
	waitUntil(t, "the hung server is restarted", func() bool { return d.Pid() != first && s.Ready() == nil })
	if s.Restarts() != 1 {
		t.Errorf("Restarts() = %d, want 1", s.Restarts())
	}
}
