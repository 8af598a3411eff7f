//go:build linux

package process_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
)

// TestExecStream talks to a command in a sandbox line by line while it runs, as the MCP
// harness talks to a stdio server: each answer comes before the next question is asked,
// and closing stdin ends the command, measured like any exec.
func TestExecStream(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	type done struct {
		res sandbox.ExecResult
		err error
	}
	ended := make(chan done, 1)
	go func() {
		// A line-at-a-time echo that knows it is sandboxed: it answers with its uid.
		res, err := rt.ExecStream(ctx, h.ID, sandbox.ExecRequest{
			Argv:    []string{"sh", "-c", `while read -r l; do echo "$(id -u) $l"; done; echo bye >&2`},
			Timeout: 30 * time.Second,
		}, inR, outW)
		inR.Close()
		outW.Close()
		ended <- done{res, err}
	}()
	rd := bufio.NewReader(outR)
	for _, q := range []string{"one", "two", "three"} {
		if _, err := inW.WriteString(q + "\n"); err != nil {
			t.Fatal(err)
		}
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("answer to %s: %v", q, err)
		}
		if f := strings.Fields(line); len(f) != 2 || f[1] != q || f[0] != strconv.Itoa(process.SandboxUID) {
			t.Fatalf("answer to %s: %q", q, line)
		}
	}
	// Another exec waits for the stream's command: one command at a time.
	other := make(chan error, 1)
	go func() {
		_, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"true"}})
		other <- err
	}()
	select {
	case err := <-other:
		t.Fatalf("an exec ran while the stream's command did: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	inW.Close()
	d := <-ended
	if d.err != nil || d.res.ExitCode != 0 || strings.TrimSpace(string(d.res.Stderr)) != "bye" || len(d.res.Stdout) != 0 || d.res.Metering.WallTime <= 0 {
		t.Fatalf("stream ended: %+v, %v", d.res, d.err)
	}
	if err := <-other; err != nil {
		t.Fatalf("the exec after the stream: %v", err)
	}
	if _, err := rt.ExecStream(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil, nil); err == nil {
		t.Fatal("ExecStream without streams succeeded")
	}
}

// TestDialSandbox reaches a port a streaming command listens on in its sandbox's own
// loopback network, and only while it runs; the host's loopback does not see it.
func TestDialSandbox(t *testing.T) {
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
		script := `import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8123)); s.listen()
c, _ = s.accept(); c.sendall(b"hello from inside\n"); c.close()
sys.stdin.read()`
		_, err := rt.ExecStream(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"python3", "-c", script}, Timeout: 30 * time.Second}, inR, io.Discard)
		inR.Close()
		ended <- err
	}()
	var c net.Conn
	for i := 0; ; i++ {
		if c, err = rt.DialSandbox(ctx, h.ID, 8123); err == nil {
			break
		}
		if i == 1500 { // 30 s: python3's start on a loaded machine took more than 5
			t.Fatalf("dial: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "hello from inside\n" {
		t.Fatalf("read %q: %v", line, err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:8123", time.Second); err == nil {
		c.Close()
		t.Error("the host's loopback reached the sandbox's port")
	}
	inW.Close()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	if _, err := rt.DialSandbox(ctx, h.ID, 8123); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("dial after the command ended: %v, want ErrInvalid", err)
	}
}
