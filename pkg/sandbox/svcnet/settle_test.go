package svcnet_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// TestSettleIsBounded: a plain TCP connection whose host never ends it, though the
// sandbox's command ended its side and exited, cannot wedge a step: Settle returns at
// its bound with the connection not recorded; it is recorded in the step it ends in
// (here the next, after the host lets go), that step's Settle waiting for it.
func TestSettleIsBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, write nothing, never close
			mu.Unlock()
			accepted <- struct{}{}
		}
	}()
	hold := sandbox.HostPort{Host: "hold.example.test", Port: 7000}
	rt, err := process.New(process.Config{StateDir: t.TempDir(), Hosts: sandbox.HostMap{hold.Host + ":" + strconv.Itoa(hold.Port) + sandbox.TCPSuffix: l.Addr().String()}})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	r := newEgressRig(t, rt, "", sandbox.Service{Hosts: []string{hold.Host}, TCPPorts: []sandbox.HostPort{hold}})
	g, err := svcnet.Attach(context.Background(), r.rt, r.h.ID, r.h.Spec.Services, svcnet.Options{OnFire: r.rec.OnFire, OnRequest: r.rec.OnRequest, SettleWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	r.g = g

	// nc sends its end at once (no input) and reads on until killed.
	res, _ := r.sh(`timeout 1 busybox nc ` + hold.Host + ` 7000 </dev/null; echo exited`)
	if strings.TrimSpace(res.Stdout) != "exited" {
		t.Fatalf("held: %+v", res)
	}
	<-accepted
	if got := r.requests(0); len(got) != 0 {
		t.Errorf("while the host holds the connection: recorded %+v, want nothing yet", got)
	}
	mu.Lock()
	for _, c := range held {
		_ = c.Close()
	}
	mu.Unlock()
	r.sh(`true`)
	if got := r.requests(1); len(got) != 1 || got[0].Host != hold.Host || got[0].Port != hold.Port || got[0].Method != svcnet.MethodTCP || got[0].Denied {
		t.Errorf("after the host let go: recorded %+v, want the connection, in this step", got)
	}
}

// TestQuietRelayCostsLaterStepsNothing: a plain TCP connection whose host holds it open
// and quiet after the sandbox ended its side costs the step that ended it at most
// Settle's bound (the host's answer to that end is awaited there), and the steps after
// nothing: their Settle finds nothing under way, so it returns settled, not at its
// bound. The host's end, when it comes, is still recorded in the step it comes in.
func TestQuietRelayCostsLaterStepsNothing(t *testing.T) {
	hold := sandbox.HostPort{Host: "quiet.example.test", Port: 7000}
	r, g, held := heldHostRig(t, hold, 300*time.Millisecond)
	t.Cleanup(func() { _ = g.Close() })

	// nc sends its end at once (no input) and reads on until killed; the host keeps quiet.
	res, _ := r.sh(`timeout 1 busybox nc ` + hold.Host + ` 7000 </dev/null; echo exited`)
	if strings.TrimSpace(res.Stdout) != "exited" {
		t.Fatalf("held: %+v", res)
	}
	c := <-held
	g.Settle(context.Background()) // the step that ended it: may wait out its bound
	for step := range 3 {
		r.sh(`true`)
		if !g.Settle(context.Background()) {
			t.Errorf("step %d after the connection went quiet: Settle returned at its bound, want settled at once", step+1)
		}
		if got := r.rec.TakeRequests(); len(got) != 0 {
			t.Errorf("step %d while the host holds the connection: recorded %+v, want nothing yet", step+1, got)
		}
	}
	_ = c.Close()
	r.sh(`true`)
	if !g.Settle(context.Background()) {
		t.Errorf("the step the host ended the connection in: Settle returned at its bound")
	}
	if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != hold.Host || got[0].Method != svcnet.MethodTCP || got[0].Denied {
		t.Errorf("after the host let go: recorded %+v, want the connection, in this step", got)
	}
}

// TestCloseEndsAHeldRelay: a relayed connection whose host holds it open and quiet
// after the sandbox ended its side does not keep the gateway's Close waiting: Close
// ends the host's side too.
func TestCloseEndsAHeldRelay(t *testing.T) {
	hold := sandbox.HostPort{Host: "closing.example.test", Port: 7000}
	r, g, held := heldHostRig(t, hold, 200*time.Millisecond)
	r.sh(`timeout 1 busybox nc ` + hold.Host + ` 7000 </dev/null; true`)
	c := <-held
	t.Cleanup(func() { _ = c.Close() })
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(30 * time.Second): // a hang guard, not a speed target: Close ends at once
		t.Fatal("Close still waits for the relay the host holds")
	}
}

// heldHostRig is a process sandbox whose plain TCP port hold reaches a host that accepts
// one connection and holds it, reading and writing nothing (held hands it to the test,
// which closes it when it wants), and the sandbox's gateway with Settle bounded at wait.
// The gateway is closed at cleanup (a second Close is harmless).
func heldHostRig(t *testing.T, hold sandbox.HostPort, wait time.Duration) (*egressRig, *svcnet.Gateway, <-chan net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			held <- c
		}
	}()
	rt, err := process.New(process.Config{StateDir: t.TempDir(), Hosts: sandbox.HostMap{hold.Host + ":" + strconv.Itoa(hold.Port) + sandbox.TCPSuffix: l.Addr().String()}})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	r := newEgressRig(t, rt, "", sandbox.Service{Hosts: []string{hold.Host}, TCPPorts: []sandbox.HostPort{hold}})
	g, err := svcnet.Attach(context.Background(), r.rt, r.h.ID, r.h.Spec.Services, svcnet.Options{OnFire: r.rec.OnFire, OnRequest: r.rec.OnRequest, SettleWait: wait})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return r, g, held
}
