//go:build linux

package netns_test

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/netns"
)

// TestListenInsideOnly: a listener made inside a pinned namespace is not reachable from
// the host's loopback, the process's own namespace is unchanged afterwards, and Remove
// unpins.
func TestListenInsideOnly(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ns")
	if err := netns.Create(p); err != nil {
		t.Fatalf("create (needs root): %v", err)
	}
	defer netns.Remove(p)
	if !netns.Pinned(p) {
		t.Fatal("not pinned after Create")
	}
	// A host listener takes a port; the namespace's listener takes the same port, which
	// only works if it really is elsewhere.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	inside, err := netns.Listen(p, "tcp", host.Addr().String())
	if err != nil {
		t.Fatalf("listen inside on the host listener's port: %v", err)
	}
	defer inside.Close()
	go func() {
		if c, err := host.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", host.Addr().String())
	if err != nil {
		t.Fatalf("the host's own listener is unreachable (this goroutine's thread left in the netns?): %v", err)
	}
	c.Close()
	// From inside, the same address reaches the namespace's listener.
	go func() {
		if c, err := inside.Accept(); err == nil {
			_, _ = c.Write([]byte("in"))
			c.Close()
		}
	}()
	ic, err := netns.Dial(context.Background(), p, "tcp", host.Addr().String())
	if err != nil {
		t.Fatalf("dial inside: %v", err)
	}
	got, _ := io.ReadAll(ic)
	ic.Close()
	if string(got) != "in" {
		t.Fatalf("dial inside reached %q, want the namespace's listener", got)
	}
	if _, err := netns.Dial(context.Background(), p, "tcp", "localhost:80"); err == nil {
		t.Fatal("dial by name accepted (its lookup would run outside the namespace)")
	}
	if err := netns.Remove(p); err != nil {
		t.Fatal(err)
	}
	if netns.Pinned(p) {
		t.Fatal("still pinned after Remove")
	}
	if _, err := netns.Listen(p, "tcp", "127.0.0.1:0"); err == nil {
		t.Fatal("listen in a removed namespace succeeded")
	}
}
