// Package faultnet applies gauntlet's network and service faults to real traffic
// between a sandbox and the services it may reach: a net.Conn and net.Listener wrapper
// (latency, loss as retransmission delay, bandwidth cap, reset after N bytes or ms,
// black-holed connections), a Resolver and a DNSServer (NXDOMAIN, SERVFAIL, lookup
// timeout) and an HTTP proxy (HTTP errors with Retry-After, truncated or garbled bodies
// and headers, broken gzip, slow bodies, plus the network faults above).
//
// Every decision comes from a inject.Decider, so which fault meets which event is a pure
// function of (seed, rule id, stream key, event count): a replay with the same seed meets
// the same faults. Streams are keyed so that concurrent streams do not perturb each other:
// a wrapped connection uses the key it was given (Listener: "conn/<n>" by accept order),
// the proxy uses "http/<host>", the resolver "dns/<host>". Every fired fault is reported
// to an optional OnFire callback, to be recorded as a step event.
//
// Sleeps honour contexts and connection closes; nothing here spawns goroutines that
// outlive the call or connection that started them.
package faultnet

import (
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// OnFire receives the faults that fired on an event, with the stream key.
type OnFire func(key string, ev catalogue.Event, fired []catalogue.Fired)

// Conn is a net.Conn whose writes meet the decider's network faults. Its connection-level
// decision (made when wrapped, as an OpConnect event) may reset it after some bytes or some
// time, black-hole it (timeout) or cap its bandwidth; each write is then an OpWrite event
// that may add latency or lose the write (costing the RTO, as TCP's retransmission does).
type Conn struct {
	net.Conn
	d      *inject.Decider
	key    string
	ev     catalogue.Event
	onFire OnFire

	written atomic.Int64 // bytes written to the peer (Written)
	once    bool         // WrapStream: no decision per write
	// segLoss: a stream (WrapStream) a packet_loss rule meets, whose bytes pay for the
	// segments it loses (lose); down and up are the offsets of the bytes written to the
	// peer and read from it (a relay has one reader and one writer).
	segLoss  bool
	down, up int64

	mu         sync.Mutex
	passed     int64 // bytes read plus written
	resetAfter int64 // -1: no byte-count reset
	bps        float64
	hole       bool // black-holed: swallow writes, block reads
	pending    time.Duration
	reset      bool
	closed     chan struct{}
	closeOnce  sync.Once
	timer      *time.Timer
	onAbort    func()
}

// OnAbort sets f to be called once, just before a fault ends the connection (a reset, or
// a black hole's hold running out): the last moment what the connection carried is
// known and its peer has not yet seen the end. A fault that fires before OnAbort is
// set (a timer shorter than the caller's set-up) calls nothing.
func (w *Conn) OnAbort(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.onAbort = f
}

// abort calls the OnAbort function, once.
func (w *Conn) abort() {
	w.mu.Lock()
	f := w.onAbort
	w.onAbort = nil
	w.mu.Unlock()
	if f != nil {
		f()
	}
}

// WrapStream wraps c as WrapConn does, but decides once, when the connection opens (its
// latency and loss are paid before its first byte): its writes meet no decisions of their
// own, so what a connection meets does not depend on how its bytes happen to be cut into
// writes, which an opaque stream (a relayed TLS connection) leaves to timing.
//
// A packet_loss rule that meets the stream acts on its bytes as TCP meets a lost
// segment: nothing is lost, but the bytes wait. Each direction's bytes are cut into
// segments of SegmentBytes, counted from the stream's start; each segment is one draw
// of the rule's loss chain, on a stream of its own per direction (key + "/down" for the
// bytes written to the peer, key + "/up" for those read from it), so which segments are
// lost depends on the seed, the key and the segment's place alone, not on how the bytes
// happen to be cut into reads and writes. A lost segment stalls its bytes, and the ones
// after it, for the rule's rto_ms before they pass (a retransmission timeout), and is
// reported to onFire as one firing. The connection's own decision may lose its SYN too
// (one RTO before the first byte).
func WrapStream(c net.Conn, d *inject.Decider, key string, ev catalogue.Event, onFire OnFire) *Conn {
	w := WrapConn(c, d, key, ev, onFire)
	w.once = true
	w.segLoss = d.Meets(w.ev, catalogue.KindPacketLoss)
	return w
}

// SegmentBytes is the size of the segments a stream's packet loss is drawn on: the
// payload of a full TCP segment on an Ethernet path (MTU 1500 less 40 bytes of IPv4 and
// TCP headers).
const SegmentBytes = 1460

// lose draws the segments that start in the n bytes at offset off of one direction of a
// stream (dir: "down" or "up") and returns the time they stall it: the rule's RTO per
// lost segment. Each loss is reported.
func (w *Conn) lose(dir string, off, n int64) time.Duration {
	var stall time.Duration
	for seg := (off + SegmentBytes - 1) / SegmentBytes; seg*SegmentBytes < off+n; seg++ {
		dec := w.d.DecideKind(w.key+"/"+dir, w.ev, catalogue.KindPacketLoss)
		if dec.Abort != catalogue.KindPacketLoss {
			continue
		}
		stall += dec.RTO
		to := "to the client"
		if dir == "up" {
			to = "from the client"
		}
		for i := range dec.Fired {
			dec.Fired[i].Detail = "segment " + strconv.FormatInt(seg, 10) + " " + to + " lost, resent after " + dec.RTO.String()
		}
		w.report(w.ev, dec)
	}
	return stall
}

// WrapConn wraps c. ev describes the connection (Host, Service; Layer and Op are set
// here). A nil decider passes everything through.
func WrapConn(c net.Conn, d *inject.Decider, key string, ev catalogue.Event, onFire OnFire) *Conn {
	ev.Layer, ev.Op = catalogue.LayerNetwork, catalogue.OpConnect
	w := &Conn{Conn: c, d: d, key: key, ev: ev, onFire: onFire, resetAfter: -1, closed: make(chan struct{})}
	dec := d.Decide(key, ev)
	w.report(ev, dec)
	w.bps = dec.BytesPerSec
	// The handshake's delay is paid by the first read or write, not here: WrapConn runs
	// in accept loops, which must not stall behind one slow connection.
	w.pending = dec.Delay
	// The timers are set under mu, as Close reads them: one may fire before the
	// assignment is done.
	w.mu.Lock()
	defer w.mu.Unlock()
	switch dec.Abort {
	case catalogue.KindReset:
		if dec.ResetAfter > 0 {
			w.timer = time.AfterFunc(dec.ResetAfter, func() { w.doReset() })
		}
		if dec.ResetAfterBytes > 0 || dec.ResetAfter == 0 {
			w.resetAfter = dec.ResetAfterBytes
		}
	case catalogue.KindTimeout:
		w.hole = true
		if dec.Hold > 0 {
			w.timer = time.AfterFunc(dec.Hold, func() { w.abort(); _ = w.Close() })
		}
	case catalogue.KindPacketLoss:
		w.pending += dec.RTO // the SYN was lost: the handshake pays one RTO
	}
	return w
}

// handshake pays the connection's pending handshake delay once; it reports false when
// the connection closed meanwhile.
func (w *Conn) handshake() bool {
	w.mu.Lock()
	d := w.pending
	w.pending = 0
	w.mu.Unlock()
	return d <= 0 || w.sleep(d)
}

func (w *Conn) report(ev catalogue.Event, dec catalogue.Decision) {
	if w.onFire != nil && len(dec.Fired) > 0 {
		w.onFire(w.key, ev, dec.Fired)
	}
}

// ErrReset is returned by a Conn the fault layer reset; it wraps syscall.ECONNRESET.
var ErrReset = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}

// doReset aborts the connection with a TCP RST (SO_LINGER 0), so the peer sees
// ECONNRESET rather than an orderly end.
func (w *Conn) doReset() {
	w.abort()
	w.mu.Lock()
	w.reset = true
	w.mu.Unlock()
	if tc, ok := w.Conn.(linger); ok {
		_ = tc.SetLinger(0)
	}
	_ = w.Close()
}

// linger is a TCP connection, or a wrapper of one that passes SetLinger on: a reset
// sets its linger to 0, so its close sends an RST.
type linger interface{ SetLinger(sec int) error }

// budget returns how many of n bytes may pass before a byte-count reset, and whether the
// connection is already reset.
func (w *Conn) budget(n int) (int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reset {
		return 0, true
	}
	if w.resetAfter < 0 {
		return n, false
	}
	left := w.resetAfter - w.passed
	if left <= 0 {
		return 0, true
	}
	return int(min(int64(n), left)), false
}

func (w *Conn) count(n int) (resetNow bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.passed += int64(n)
	return w.resetAfter >= 0 && w.passed >= w.resetAfter
}

// Read reads from the connection. A black-holed connection delivers nothing: it discards
// what arrives and returns only the underlying error (a deadline, a close), so a client
// waits for an answer that never comes. The peer's end is swallowed too (Read waits for
// the connection's close instead): a relay that passed it on would end the connection,
// and the peer, which closed its side to wait for the answer, would not wait.
func (w *Conn) Read(p []byte) (int, error) {
	if !w.handshake() {
		return 0, net.ErrClosed
	}
	if w.hole {
		for {
			if _, err := w.Conn.Read(p); err == io.EOF {
				<-w.closed
				return 0, net.ErrClosed
			} else if err != nil {
				return 0, err
			}
		}
	}
	k, isReset := w.budget(len(p))
	if isReset {
		w.doReset()
		return 0, ErrReset
	}
	n, err := w.Conn.Read(p[:k])
	if n > 0 && w.count(n) {
		defer w.doReset()
	}
	if w.segLoss && n > 0 {
		// The bytes arrived; those of a lost segment pass on after its resend.
		stall := w.lose("up", w.up, int64(n))
		w.up += int64(n)
		if stall > 0 && !w.sleep(stall) {
			return 0, net.ErrClosed
		}
	}
	w.throttle(n)
	if err != nil && w.isReset() {
		return n, ErrReset
	}
	return n, err
}

// Write writes to the connection as one OpWrite event: latency and loss delay it, the
// bandwidth cap paces it, a byte-count reset cuts it.
func (w *Conn) Write(p []byte) (int, error) {
	if !w.handshake() {
		return 0, net.ErrClosed
	}
	if w.hole {
		return len(p), nil // swallowed: nobody answers
	}
	if !w.once {
		ev := w.ev
		ev.Op = catalogue.OpWrite
		dec := w.d.Decide(w.key, ev)
		w.report(ev, dec)
		wait := dec.Delay
		if dec.Abort == catalogue.KindPacketLoss {
			wait += dec.RTO
		}
		if wait > 0 && !w.sleep(wait) {
			return 0, net.ErrClosed
		}
	}
	if w.segLoss {
		return w.writeSegments(p)
	}
	return w.send(p)
}

// writeSegments writes p segment by segment of the stream's bytes, each lost segment
// waiting its RTO before it and the rest are sent.
func (w *Conn) writeSegments(p []byte) (int, error) {
	sent := 0
	for len(p) > 0 {
		k := int(min(int64(len(p)), SegmentBytes-w.down%SegmentBytes))
		if stall := w.lose("down", w.down, int64(k)); stall > 0 && !w.sleep(stall) {
			return sent, net.ErrClosed
		}
		n, err := w.send(p[:k])
		sent += n
		w.down += int64(n)
		if err == nil && n < k {
			err = io.ErrShortWrite
		}
		if err != nil {
			return sent, err
		}
		p = p[k:]
	}
	return sent, nil
}

// send writes p to the connection: a byte-count reset cuts it, the bandwidth cap paces
// it.
func (w *Conn) send(p []byte) (int, error) {
	k, isReset := w.budget(len(p))
	if isReset {
		w.doReset()
		return 0, ErrReset
	}
	// Counted before they leave: the peer may read them, and close, before this Write
	// returns, and a reader of Written that saw that close must find them counted.
	w.written.Add(int64(k))
	n, err := w.Conn.Write(p[:k])
	if n < k {
		w.written.Add(int64(n - k))
	}
	w.throttle(n)
	if n > 0 && w.count(n) {
		w.doReset()
		if err == nil && n < len(p) {
			err = ErrReset
		}
	}
	if err != nil && w.isReset() {
		return n, ErrReset
	}
	return n, err
}

// Written returns the bytes written to the peer so far, counted as they are handed to
// the connection (before the write returns, and before a bandwidth cap's pause); bytes a
// failed write did not send are taken back.
func (w *Conn) Written() int64 { return w.written.Load() }

func (w *Conn) isReset() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reset
}

func (w *Conn) throttle(n int) {
	if w.bps > 0 && n > 0 {
		w.sleep(time.Duration(float64(n) / w.bps * float64(time.Second)))
	}
}

// sleep waits d unless the connection closes first; it reports whether it slept fully.
func (w *Conn) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.closed:
		return false
	}
}

// Close closes the connection and stops its fault timers.
func (w *Conn) Close() error {
	var err error
	w.closeOnce.Do(func() {
		close(w.closed)
		w.mu.Lock()
		t := w.timer
		w.mu.Unlock()
		if t != nil {
			t.Stop()
		}
		w.d.Forget(w.key) // connection keys are never reused
		if w.segLoss {
			w.d.Forget(w.key + "/down")
			w.d.Forget(w.key + "/up")
		}
		err = w.Conn.Close()
	})
	return err
}

// Listener wraps accepted connections in Conn, keyed "conn/<n>" by accept order.
type Listener struct {
	net.Listener
	D      *inject.Decider
	Event  catalogue.Event
	OnFire OnFire

	mu sync.Mutex
	n  uint64
}

// Accept accepts and wraps the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	key := "conn/" + strconv.FormatUint(l.n, 10)
	l.n++
	l.mu.Unlock()
	return WrapConn(c, l.D, key, l.Event, l.OnFire), nil
}
