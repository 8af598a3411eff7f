package bus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/nats-io/nats.go"
)

// One holder at a time: a second instance waits while the first renews, takes the lease
// at once when it is released, and within about LeaseTTL when its holder dies without
// releasing it; a holder whose lease another took is told at once.
func TestLeaseHasOneHolder(t *testing.T) {
	b := bustest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, c := b.NewLease("role", "a", log), b.NewLease("role", "c", log)
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, stopA := context.WithCancel(ctx)
	held := make(chan error, 1)
	go func() { held <- a.Hold(hctx, func() {}) }()

	// While a renews, c waits, across several renewals and past the TTL.
	wctx, wcancel := context.WithTimeout(ctx, bus.LeaseTTL+time.Second)
	err := c.Acquire(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) || !a.Held() {
		t.Fatalf("second instance's Acquire while the first holds it: %v (first holds: %v)", err, a.Held())
	}

	// Released: c takes it at once.
	stopA()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := c.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > bus.LeaseTTL/2 {
		t.Errorf("took a released lease after %v", took)
	}

	// c dies holding it (no renewal, no release): a takes it once the entry expires.
	begin = time.Now()
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < bus.LeaseTTL/2 || took > 2*bus.LeaseTTL {
		t.Errorf("took a dead holder's lease after %v, want about %v", took, bus.LeaseTTL)
	}

	// c, back and still believing it holds the lease, learns it lost it on its next renewal.
	lost := make(chan struct{})
	if err := c.Hold(ctx, func() { close(lost) }); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("Hold of a lease another took: %v, want ErrLeaseLost", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("Hold returned ErrLeaseLost without calling lost")
	}
	if c.Held() {
		t.Error("a lost lease still counts as held")
	}
}

// heldReads is an in-process connection to a server whose replies can be held back for a
// while, as on a server or process too busy to answer: what the client writes still reaches
// the server (a renewal is applied), its answers arrive only once released.
type heldReads struct {
	provider nats.InProcessConnProvider
	mu       sync.Mutex
	gate     chan struct{} // closed while replies flow
}

func (h *heldReads) InProcessConn() (net.Conn, error) {
	c, err := h.provider.InProcessConn()
	if err != nil {
		return nil, err
	}
	return &heldConn{Conn: c, h: h}, nil
}

// hold holds every reply back for d, from now.
func (h *heldReads) hold(d time.Duration) {
	h.mu.Lock()
	gate := make(chan struct{})
	h.gate = gate
	h.mu.Unlock()
	time.AfterFunc(d, func() { close(gate) })
}

func (h *heldReads) wait() {
	h.mu.Lock()
	gate := h.gate
	h.mu.Unlock()
	if gate != nil {
		<-gate
	}
}

type heldConn struct {
	net.Conn
	h *heldReads
}

func (c *heldConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.h.wait()
	return n, err
}

// startHeld starts a bus whose holder's connection is hr (replies that can be held back)
// and returns it with a second, ordinary bus on the same server.
func startHeld(t *testing.T, log *slog.Logger) (held, other *bus.Bus, hr *heldReads) {
	t.Helper()
	srv := bus.NewServer(bus.ServerConfig{StoreDir: t.TempDir(), Port: -1}, log)
	if err := srv.Starting(context.Background()); err != nil {
		t.Fatalf("start embedded NATS: %v", err)
	}
	t.Cleanup(func() { _ = srv.Stopping(context.Background()) })
	var o nats.Options
	if err := srv.ConnectOption()(&o); err != nil {
		t.Fatal(err)
	}
	hr = &heldReads{provider: o.InProcessServer}
	held, err := bus.Connect("", t.Name()+"-held", log, nats.InProcessServer(hr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Close() })
	other, err = bus.Connect("", t.Name(), log, srv.ConnectOption())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	if err := other.EnsureStreams(context.Background(), bus.DefaultStreamConfig()); err != nil {
		t.Fatalf("create streams: %v", err)
	}
	return held, other, hr
}

// A holder whose renewals go unanswered for a while shorter than the TTL (a busy server, a
// starved process) keeps its lease: it retries until the lease's own expiry instead of
// stepping down at its first late renewal, and a renewal that landed while its answer was
// late is recognised as its own. The lease stays one holder's throughout.
func TestLeaseSurvivesRenewalsLateWithinItsTTL(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	held, other, hr := startHeld(t, log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := held.NewLease("role", "a", log)
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, stopA := context.WithCancel(ctx)
	lost := make(chan struct{})
	holding := make(chan error, 1)
	go func() { holding <- a.Hold(hctx, func() { close(lost) }) }()

	// Just past a renewal, answers stop for 2/3 of the TTL: the renewal due then, and
	// its retries, are answered late or not at all.
	time.Sleep(bus.LeaseTTL/3 + bus.LeaseTTL/12)
	hr.hold(2 * bus.LeaseTTL / 3)
	// Another instance cannot take the lease meanwhile, nor for several renewals after.
	wctx, wcancel := context.WithTimeout(ctx, 2*bus.LeaseTTL)
	err := other.NewLease("role", "c", log).Acquire(wctx)
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("another instance's Acquire while the first holds it: %v", err)
	}
	select {
	case <-lost:
		t.Fatal("the holder stepped down over renewals late by less than the lease's TTL")
	default:
	}
	if !a.Held() {
		t.Error("the holder no longer counts its lease as held")
	}
	stopA()
	if err := <-holding; err != nil {
		t.Fatalf("Hold: %v", err)
	}
	// Still the holder's own revision: it releases the lease, and another takes it at once.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := other.NewLease("role", "c", log).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > bus.LeaseTTL/2 {
		t.Errorf("took a released lease after %v", took)
	}
}

// A holder that cannot renew for longer than the TTL steps down, at the lease's expiry:
// not before (it may still renew), and not long after (a standby may hold it by then).
func TestLeaseLostAtItsExpiryWhenRenewalsStayUnanswered(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	held, other, hr := startHeld(t, log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var logged lockedBuffer
	a := held.NewLease("role", "a", slog.New(slog.NewJSONHandler(&logged, nil)))
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	lost := make(chan time.Time, 1)
	holding := make(chan error, 1)
	go func() { holding <- a.Hold(ctx, func() { lost <- time.Now() }) }()

	time.Sleep(bus.LeaseTTL/3 + bus.LeaseTTL/12) // just past a renewal
	stalled := time.Now()
	hr.hold(bus.LeaseTTL + bus.LeaseTTL/2)
	var at time.Time
	select {
	case at = <-lost:
	case <-time.After(2 * bus.LeaseTTL):
		t.Fatal("the holder never stepped down although it could not renew for 1.5 TTL")
	}
	// The last renewal was at most LeaseTTL/3 before the stall began.
	if after := at.Sub(stalled); after < 2*bus.LeaseTTL/3-bus.LeaseTTL/12 || after > bus.LeaseTTL+bus.LeaseTTL/12 {
		t.Errorf("stepped down %v after renewals stopped being answered; want by the lease's expiry (%v to %v)",
			after.Round(10*time.Millisecond), 2*bus.LeaseTTL/3, bus.LeaseTTL)
	}
	if err := <-holding; !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("Hold: %v, want ErrLeaseLost", err)
	}
	if a.Held() {
		t.Error("a lost lease still counts as held")
	}
	// The loss is logged at WARN with its reason and how late the renewal was.
	var loss struct{ Level, Reason, Late, Since string }
	for _, line := range strings.Split(logged.String(), "\n") {
		if strings.Contains(line, `"msg":"leader lease lost"`) {
			var rec struct {
				Level  string `json:"level"`
				Reason string `json:"reason"`
				Late   any    `json:"late"`
				Since  any    `json:"since_last_renewal"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatal(err)
			}
			loss.Level, loss.Reason = rec.Level, rec.Reason
			loss.Late, loss.Since = fmt.Sprint(rec.Late), fmt.Sprint(rec.Since)
		}
	}
	if loss.Level != "WARN" || loss.Reason != "not renewed within its TTL" || loss.Late == "<nil>" || loss.Since == "<nil>" {
		t.Errorf("the loss logged as %+v; want at WARN with its reason, how late and since when:\n%s", loss, logged.String())
	}
	// The entry expires on the server too: another instance takes it.
	if err := other.NewLease("role", "c", log).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
}

// lockedBuffer is a log's output read while the lease still writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A holder stopped while a renewal's answer is late still releases its lease: the renewal
// landed (the key moved to a later revision of the holder's own), so Release deletes that
// revision instead of refusing with "wrong last sequence", and a standby takes over at once.
func TestLeaseReleasedAfterARenewalCutShortByStop(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	held, other, hr := startHeld(t, log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := held.NewLease("role", "a", log)
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := bus.NewBucket(other.JS, bus.BucketLeases).KV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := kv.Get(ctx, "role")
	if err != nil {
		t.Fatal(err)
	}
	hctx, stopA := context.WithCancel(ctx)
	holding := make(chan error, 1)
	go func() { holding <- a.Hold(hctx, func() {}) }()

	// Answers stop just before the first renewal is due, for long enough that it lands
	// unanswered; the holder is stopped meanwhile.
	time.Sleep(bus.LeaseTTL/3 - bus.LeaseTTL/12)
	hr.hold(bus.LeaseTTL / 3)
	deadline := time.Now().Add(bus.LeaseTTL / 3)
	for {
		e, err := kv.Get(ctx, "role")
		if err != nil {
			t.Fatal(err)
		}
		if e.Revision() > first.Revision() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal never landed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopA()
	if err := <-holding; err != nil {
		t.Fatalf("Hold: %v", err)
	}
	hr.wait()
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release after a renewal that landed unanswered: %v", err)
	}
	begin := time.Now()
	if err := other.NewLease("role", "c", log).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > bus.LeaseTTL/2 {
		t.Errorf("took a released lease after %v", took)
	}
}
