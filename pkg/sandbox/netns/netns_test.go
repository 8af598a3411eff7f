//go:build linux

package netns_test

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

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

// TestListenPacketInside: a UDP socket made inside a namespace (the sandbox's name
// server at 127.0.0.53:53) answers datagrams sent inside it, and the host's loopback
// does not reach it.
func TestListenPacketInside(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ns")
	if err := netns.Create(p); err != nil {
		t.Fatalf("create (needs root): %v", err)
	}
	defer netns.Remove(p)
	pc, err := netns.ListenPacket(p, "udp", "127.0.0.53:53")
	if err != nil {
		t.Fatalf("listen inside: %v", err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 16)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("re:"), buf[:n]...), from)
		}
	}()
	ask := func(c net.Conn) (string, error) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("hi")); err != nil {
			return "", err
		}
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	c, err := netns.Dial(context.Background(), p, "udp", "127.0.0.53:53")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ask(c); err != nil || got != "re:hi" {
		t.Fatalf("inside: %q, %v", got, err)
	}
	hc, err := net.Dial("udp", "127.0.0.53:53")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ask(hc); err == nil && got == "re:hi" {
		t.Fatal("the host's loopback reached the namespace's socket")
	}
	if _, err := netns.ListenPacket(p, "udp", "localhost:53"); err == nil {
		t.Fatal("listen by name accepted")
	}
}
