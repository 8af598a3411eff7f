package sandboxtest

import (
	"bufio"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// streamer: a command is talked to line by line while it runs, as the MCP harness talks
// to a stdio server (each answer comes before the next question is asked); another exec
// waits for it (one command at a time); closing stdin ends it, measured like any exec,
// with its stderr captured and no stdout in the result; a caller's stream that is not a
// file works too.
func (s *suite) streamer(t *testing.T) {
	rt := s.open(t, t.TempDir())
	st, is := rt.(sandbox.Streamer)
	if !is {
		s.lacks(t, rt, Streams)
		return
	}
	h := s.create(t, rt, sandbox.Spec{})
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
		res, err := st.ExecStream(ctx(t), h.ID, sh(`while read -r l; do echo "got $l"; done; echo bye >&2`), inR, outW)
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
		if err != nil || line != "got "+q+"\n" {
			t.Fatalf("answer to %s: %q, %v", q, line, err)
		}
	}
	other := make(chan error, 1)
	go func() {
		_, err := rt.Exec(ctx(t), h.ID, sandbox.ExecRequest{Argv: []string{"true"}})
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
	if _, err := rd.ReadString('\n'); err != io.EOF {
		t.Fatalf("stdout after the command ended: %v, want EOF", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("the exec after the stream: %v", err)
	}
	// Streams that are not files.
	var out strings.Builder
	res, err := st.ExecStream(ctx(t), h.ID, sh(`read -r l; echo "got $l"`), strings.NewReader("four\n"), &out)
	if err != nil || res.ExitCode != 0 || out.String() != "got four\n" {
		t.Fatalf("stream from a reader to a builder: %q, %+v, %v", out.String(), res, err)
	}
	if _, err := st.ExecStream(ctx(t), h.ID, sandbox.ExecRequest{Argv: []string{"true"}}, nil, nil); err == nil {
		t.Fatal("ExecStream without streams succeeded")
	}
}

// dialer: the host reaches a port a streaming command listens on in its sandbox's own
// loopback network; the host's loopback does not see it.
func (s *suite) dialer(t *testing.T) {
	rt := s.open(t, t.TempDir())
	dl, is := rt.(sandbox.Dialer)
	st, streams := rt.(sandbox.Streamer)
	if !is || !streams {
		s.lacks(t, rt, Dials)
		return
	}
	h := s.create(t, rt, sandbox.Spec{})
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	type done struct {
		res sandbox.ExecResult
		err error
	}
	ended := make(chan done, 1)
	go func() {
		// busybox's nc (in every runtime's root: the host's busybox-static, the
		// containerd image's own) answers one connection; the command ends with stdin.
		res, err := st.ExecStream(ctx(t), h.ID, sh(`echo hello from inside | busybox nc -l -p 8123 & cat >/dev/null`), inR, io.Discard)
		inR.Close()
		ended <- done{res, err}
	}()
	var c net.Conn
	for i := 0; ; i++ {
		if c, err = dl.DialSandbox(ctx(t), h.ID, 8123); err == nil {
			line, rerr := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if rerr == nil && line == "hello from inside\n" {
				break
			}
			err = rerr
		}
		if i == 250 {
			inW.Close()
			d := <-ended
			t.Fatalf("dial: %v (the command: %+v, %v)", err, d.res, d.err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:8123", time.Second); err == nil {
		c.Close()
		t.Error("the host's loopback reached the sandbox's port")
	}
	inW.Close()
	if d := <-ended; d.err != nil {
		t.Fatal(d.err)
	}
	if _, err := dl.DialSandbox(ctx(t), h.ID, 0); err == nil {
		t.Fatal("dial to port 0 succeeded")
	}
}
