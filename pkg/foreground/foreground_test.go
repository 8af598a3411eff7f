package foreground_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/foreground"
)

// signalWriter reports each line printed, so the test signals only once Run listens,
// with what the ready file held at that moment (when ready names one).
type signalWriter struct {
	lines chan string
	ready string
	seen  chan string
}

func (w signalWriter) Write(p []byte) (int, error) {
	if w.ready != "" {
		b, err := os.ReadFile(w.ready)
		if err != nil {
			w.seen <- err.Error()
		} else {
			w.seen <- string(b)
		}
	}
	w.lines <- string(p)
	return len(p), nil
}

// TestRunStopsOnSIGTERM: the address is written to the ready file, whole, before it is
// printed (whoever reads the printed line finds the file done), and the server is stopped
// once, with a deadline, when the process gets SIGTERM.
func TestRunStopsOnSIGTERM(t *testing.T) {
	ready := filepath.Join(t.TempDir(), "ready")
	out := signalWriter{lines: make(chan string, 1), ready: ready, seen: make(chan string, 1)}
	stops := make(chan bool, 2)
	done := make(chan error, 1)
	go func() {
		done <- foreground.Run(out, ready, func(ctx context.Context) (foreground.Server, error) {
			return foreground.Server{Addr: "127.0.0.1:5000", Stop: func(ctx context.Context) error {
				_, ok := ctx.Deadline()
				stops <- ok
				return errors.New("stop failed")
			}}, nil
		})
	}()
	if line := <-out.lines; line != "127.0.0.1:5000\n" {
		t.Errorf("printed %q", line)
	}
	if seen := <-out.seen; seen != "127.0.0.1:5000\n" {
		t.Errorf("ready file when the address was printed: %q", seen)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || err.Error() != "stop failed" {
		t.Errorf("Run = %v, want Stop's error", err)
	}
	if n := len(stops); n != 1 {
		t.Fatalf("Stop called %d times, want once", n)
	}
	if !<-stops {
		t.Error("Stop's context has no deadline")
	}
}

// TestRunStopsWhenTheReadyFileFails: a ready file that cannot be written stops the server
// and is the error, with no address printed; a failed start is returned as it is.
func TestRunStopsWhenTheReadyFileFails(t *testing.T) {
	stopped := 0
	out := signalWriter{lines: make(chan string, 1)}
	err := foreground.Run(out, filepath.Join(t.TempDir(), "no", "such", "dir"), func(context.Context) (foreground.Server, error) {
		return foreground.Server{Addr: "a", Stop: func(context.Context) error { stopped++; return nil }}, nil
	})
	if !errors.Is(err, os.ErrNotExist) || stopped != 1 || len(out.lines) != 0 {
		t.Errorf("Run = %v, stopped %d times, %d lines printed; want a missing directory, stopped once, nothing printed", err, stopped, len(out.lines))
	}
	boom := errors.New("boom")
	err = foreground.Run(out, "", func(context.Context) (foreground.Server, error) { return foreground.Server{}, boom })
	if err != boom || len(out.lines) != 0 {
		t.Errorf("Run = %v, want the start error and nothing printed", err)
	}
}
