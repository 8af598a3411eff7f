//go:build linux

package process_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
)

// What streams do on every runtime (line by line, one command at a time, metered) is the
// shared conformance suite's (sandboxtest's streamer and dialer, run for this runtime in
// TestConformance). What is this runtime's own is here.

// A streamed command runs as the sandbox's user, as an exec does: the MCP servers the
// harness starts this way are no more privileged than the agent's commands.
func TestExecStreamRunsAsTheSandboxUser(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := rt.ExecStream(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", `read -r l; echo "$(id -u) $l"`}, Timeout: 30 * time.Second},
		strings.NewReader("one\n"), &out)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("stream: %+v, %v", res, err)
	}
	if want := strconv.Itoa(process.SandboxUID) + " one\n"; out.String() != want {
		t.Fatalf("streamed command answered %q, want %q (run as the sandbox's uid)", out.String(), want)
	}
}

// DialSandbox reaches the sandbox's network only while a streamed command runs in it
// (the sandbox's namespace lives with its command here); before and after, it refuses
// with ErrInvalid rather than dialing something else.
func TestDialSandboxOnlyWhileACommandRuns(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.DialSandbox(ctx, h.ID, 8123); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("dial with nothing running: %v, want ErrInvalid", err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := rt.ExecStream(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "cat >/dev/null"}, Timeout: 30 * time.Second}, inR, io.Discard)
		inR.Close()
		ended <- err
	}()
	// Running: the dial reaches the namespace (nothing listens: refused, not ErrInvalid).
	for i := 0; ; i++ {
		c, err := rt.DialSandbox(ctx, h.ID, 8123)
		if err == nil {
			c.Close()
			t.Fatal("dial reached a port nothing listens on")
		}
		if !errors.Is(err, sandbox.ErrInvalid) {
			break
		}
		if i == 1500 { // 30 s on a loaded machine
			t.Fatalf("dial while the command runs: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	inW.Close()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	if _, err := rt.DialSandbox(ctx, h.ID, 8123); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("dial after the command ended: %v, want ErrInvalid", err)
	}
}
