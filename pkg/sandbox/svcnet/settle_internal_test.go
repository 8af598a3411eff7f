package svcnet

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestSettleSeesAConnectionBeingAccepted: a connection the kernel has handed to the
// accept loop but the gateway has not noted in flight yet is in neither the listener's
// queue nor the flights; Settle must still wait for it and see it recorded. The accept
// loop is held in that gap (the accepted hook) while Settle runs.
func TestSettleSeesAConnectionBeingAccepted(t *testing.T) {
	rec := &Recorder{}
	g := &Gateway{opt: Options{OnRequest: rec.OnRequest, SettleWait: time.Hour}, conns: map[net.Conn]struct{}{}, settled: make(chan struct{}, 1)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.listeners = append(g.listeners, l)
	fl := g.flown(l)
	inGap, release := make(chan struct{}), make(chan struct{})
	fl.accepted = func(net.Conn) {
		close(inGap)
		<-release
	}
	g.wg.Add(1)
	go g.serveEach(fl, func(c net.Conn, _ uint64, at int64) {
		g.request(Request{Host: "gap.example.test", Method: MethodTCP, at: at})
		g.land(c)
	})
	t.Cleanup(func() { _ = g.Close() })

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close() // the sandbox's command ended: its end is input the gateway has to read
	<-inGap       // out of the listener's queue, not in flight
	go func() {
		// Whenever the loop goes on, Settle must have waited for it: the connection
		// was the sandbox's before Settle began.
		time.Sleep(20 * time.Millisecond)
		close(release)
	}()
	if !g.Settle(context.Background()) {
		t.Fatal("Settle returned at its bound")
	}
	if got := rec.TakeRequests(); len(got) != 1 || got[0].Host != "gap.example.test" {
		t.Errorf("after Settle: recorded %+v, want the connection accepted before it began", got)
	}
}
