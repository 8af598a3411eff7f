package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCallReachesASocketPastTheLengthLimit: a runtime's state directory may be deep
// enough (a long --data-dir, a test's temporary directory) that a sandbox's agent
// socket path is longer than the 107 bytes a unix socket address holds. Call must still
// reach the agent there; it failed with "connect: invalid argument".
func TestCallReachesASocketPastTheLengthLimit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 40))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, SocketName)
	if len(path) <= 107 {
		t.Fatalf("socket path of %d bytes, want one past the limit", len(path))
	}
	// The agent binds inside its sandbox at a short path; here the same file is bound
	// through the directory's descriptor.
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, SocketName))
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var req Request
		if json.NewDecoder(c).Decode(&req) == nil {
			_ = json.NewEncoder(c).Encode(Response{ExitCode: 7})
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := Call(ctx, path, Request{})
	if err != nil || resp.ExitCode != 7 {
		t.Fatalf("Call over a %d-byte socket path: %+v, %v", len(path), resp, err)
	}
}
