package svcnet

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSettleWait is Options.SettleWait's default.
const DefaultSettleWait = time.Second

// settleTick is how often Settle looks again at connections that may still have work
// queued when nothing told it they are done.
const settleTick = 2 * time.Millisecond

// flight is a connection of the sandbox's the gateway has taken and not yet recorded:
// a relayed TLS or TCP connection until it is recorded, or an HTTP connection until it
// closes.
type flight struct {
	// dialing: the gateway is connecting to the relay's host (work under way: the
	// sandbox asked for it, and nothing is sent either way before it ends).
	dialing bool
	// busy: a request on it is being served (HTTP): it is recorded when that ends. Work
	// under way, unless its answer waits for the sandbox to read, or its body for the
	// host (stalled).
	busy bool
	// host is a relay's connection to the host, once dialled, or the one the request
	// being served is sent on, until its answer begins: bytes or an end the host sent
	// and the relay has not read yet are work under way, unless the relay's write toward
	// the sandbox waits for the sandbox to read (stalled); a write toward the host that
	// waits for the host to read (stalled) holds the sandbox's bytes, which are then not.
	host net.Conn
	// ended: the relay has read the sandbox's end. The sandbox's side then stays
	// readable (an end reads again and again), so it no longer says anything is under
	// way; the host's answer to that end is awaited instead, until a Settle waits it
	// out (idle).
	ended bool
	// idle: a Settle reached its bound awaiting the host's answer to the sandbox's end;
	// from then on the relay is waited for only when the host sends something.
	idle bool
}

// Settle is the gateway's barrier at the end of a sandbox's step: when it returns, what
// the sandbox did on the network until then is recorded (Options.OnRequest, OnFire),
// however late the gateway's goroutines would have come to it. Every refusal the
// sandbox's kernel already sent is read; every connection waiting to be accepted is
// taken; every request being served, and every connection whose sandbox side has
// something the gateway has not read yet (bytes, or its end), is waited for until it
// is recorded, and so is a relay whose host sent something the gateway has not read
// yet, or whose sandbox ended its side and whose host has not answered that end yet. A
// connection held open and quiet is not waited for: by the sandbox (a background
// process's), or by the host after the sandbox's end, once one Settle waited that
// answer out to its bound (the steps after pay nothing for it); it is recorded when it
// ends, in the step it ends in. Nor is a connection whose sandbox stopped reading: when
// the gateway's write toward the sandbox (a relay's, of what the host keeps sending, or
// an HTTP answer) found the socket's buffer full and waits for room, what comes after
// it waits for the sandbox, not for the gateway, and no bound would see it through.
// Nor, the mirror case, the bytes of a sandbox whose host stopped reading: a relay's
// write toward the host, or an HTTP request's body sent on before the host answered,
// that found the host socket's buffer full waits for the host. Either is waited for
// again as soon as the side that stopped reads (the buffer has room) or goes away (its
// socket is reset), so what the gateway then passes on is recorded in the step that
// happens in; a relay, or a request's body, whose host stopped reading is ended when
// the sandbox resets its side (dropAborted), and recorded in that step; the gateway's
// own delays (a bandwidth cap's pace, a lost segment's resend, a dial) are waited for
// as before. A connection an accept loop has taken but not noted yet is waited for too
// (fence). The wait is bounded by
// Options.SettleWait and by ctx, so that a host that never answers cannot wedge the
// step; what is still under way then is recorded when it ends. Settle is safe to call
// concurrently with the traffic and with itself; after Close it returns at once. It
// reports whether everything was recorded: false when it returned at its bound or at
// ctx's end with something still under way.
func (g *Gateway) Settle(ctx context.Context) bool {
	if g.isClosed() {
		return true
	}
	deadline := time.Now().Add(g.opt.SettleWait)
	var timer *time.Timer
	for {
		g.drainRefusals()
		g.dropAborted()
		if !g.unsettled() {
			// Nothing seen: a connection an accept loop took but has not noted yet is
			// seen once its loop answers a fence.
			if !g.fence(ctx, deadline) {
				return false
			}
			if !g.unsettled() {
				// A refusal is sent with the connect() that meets it, before the
				// sandbox goes on: read those of the connections just settled, too.
				g.drainRefusals()
				return true
			}
			continue
		}
		wait := min(settleTick, time.Until(deadline))
		if wait <= 0 {
			g.idleEnded()
			return false
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return false
		case <-g.settled:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

// unsettled reports whether the gateway has work the sandbox already gave it: a
// connection waiting in a listener's queue, a relay dialling its host (until the dial
// ends: a host slow to accept would otherwise have its connection recorded in a later
// step, or, failed, in none), a request being served, a connection with
// input the gateway has not read (data or its end) on the sandbox's side or, for a
// relay, on the host's, or a relay whose sandbox ended its side and whose host has not
// answered yet (until a Settle waited that out: then the relay is idle, held open and
// quiet by the host, and costs nothing until the host sends something). Each direction
// of a connection is looked at on its own: one whose write toward its receiver waits
// for the receiver to read (stalled) has nothing the gateway can finish before it
// does. Toward the sandbox, that holds a relay's host bytes and its host's answer to
// the sandbox's end, or an HTTP answer; toward the host, the sandbox's bytes and end,
// or the rest of an HTTP request's body while the host has not answered.
func (g *Gateway) unsettled() bool {
	for _, l := range g.listeners {
		if readable(l) {
			return true
		}
	}
	type look struct {
		c, host                    net.Conn
		dialing, busy, ended, idle bool
	}
	g.mu.Lock()
	looks := make([]look, 0, len(g.flights))
	for c, f := range g.flights {
		looks = append(looks, look{c, f.host, f.dialing, f.busy, f.ended, f.idle})
	}
	g.mu.Unlock()
	for _, l := range looks {
		if l.dialing {
			return true
		}
		down := stalled(l.c)                   // the write toward the sandbox waits for it
		up := l.host != nil && stalled(l.host) // the write toward the host waits for it
		if l.busy {
			// An answer being served waits behind down; a body being sent behind up,
			// unless the host has begun to answer.
			if down || up && !readable(l.host) {
				continue
			}
			return true
		}
		if !up && !l.ended && readable(l.c) {
			return true
		}
		if !down && (l.ended && !l.idle || l.host != nil && readable(l.host)) {
			return true
		}
	}
	return false
}

// dropAborted closes the connection to the host of every relay, and of every request
// whose body is being sent, whose write toward the host waits for the host to read
// (stalled) while the sandbox has reset its connection: the bytes the write holds belong
// to a stream the sandbox aborted, and nothing else would end it before the host reads
// or goes away. The relay then ends, or the request fails, and is recorded in the step
// the gateway noticed the reset in. A sandbox that ended its side in order (its end
// queued behind the bytes) still has them passed on when the host reads.
func (g *Gateway) dropAborted() {
	type sends struct{ c, host net.Conn }
	var all []sends
	g.mu.Lock()
	for c, f := range g.flights {
		if f.host != nil {
			all = append(all, sends{c, f.host})
		}
	}
	g.mu.Unlock()
	for _, s := range all {
		if stalled(s.host) && aborted(s.c) {
			_ = s.host.Close()
		}
	}
}

// aborted reports whether c's socket has an error pending, as a connection the far side
// reset has until something reads or writes it.
func aborted(c net.Conn) bool {
	return poll(c, 0)&unix.POLLERR != 0
}

// idleEnded marks every relay awaiting its host's answer to the sandbox's end as idle:
// a Settle waited for that answer until its bound.
func (g *Gateway) idleEnded() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range g.flights {
		if f.ended {
			f.idle = true
		}
	}
}

// readable reports whether s (a socket: a listener or a connection) has input queued:
// a connection to accept, bytes to read, or its end. A socket that cannot be polled
// (a runtime's listener without a file descriptor) counts as having none.
func readable(s any) bool {
	return poll(s, unix.POLLIN|unix.POLLRDHUP)&(unix.POLLIN|unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}

// stalled reports whether the gateway's write on c (one of stallConn's) waits for the
// far side, the sandbox or a host, to read: it found the socket's buffer full, and the
// buffer still has no room and the socket no error or end (the far side neither read
// nor went away since). The gateway's own delays (a bandwidth cap's pace, a lost
// segment's resend) are not writes that wait: they still count as work under way.
func stalled(c net.Conn) bool {
	s, ok := c.(*stallConn)
	if !ok || !s.full.Load() {
		return false
	}
	return poll(s, unix.POLLOUT)&(unix.POLLOUT|unix.POLLERR|unix.POLLHUP) == 0
}

// poll returns the events of s (a socket) among events, and its errors and end, now;
// POLLOUT alone (room, no input) when s cannot be polled.
func poll(s any, events int16) int16 {
	revents := int16(unix.POLLOUT)
	sc, ok := s.(syscall.Conn)
	if !ok {
		return revents
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return revents
	}
	_ = rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: events}}
		for {
			n, err := unix.Poll(p, 0)
			if err == unix.EINTR {
				continue
			}
			if err == nil {
				revents = 0
				if n > 0 {
					revents = p[0].Revents
				}
			}
			return
		}
	})
	return revents
}

// stallConn is a TCP connection of the gateway's whose far side may stop reading,
// written through its file descriptor so that the gateway knows when a write waits for
// the far side to read (stalled). An egress listener's connections from the sandbox
// are: a background process that stopped reading what its host keeps sending, a command
// that exited leaving the socket to a sleeping process. So are the gateway's
// connections to the hosts (a relay's, an HTTP request's): a host that stalls an
// upload, a peer that never reads. It offers what the gateway, net/http's transport and
// the fault layer ask of a TCP connection.
type stallConn struct {
	net.Conn
	tcp *net.TCPConn
	rc  syscall.RawConn
	// full: a write found the socket's send buffer full and waits for room; cleared
	// when a write goes on.
	full atomic.Bool
}

// watchStalls wraps c, a connection from the sandbox or to a host, as a stallConn when
// it is a TCP connection with a file descriptor; else it returns c (its writes are never
// seen as stalled).
func watchStalls(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &stallConn{Conn: tc, tcp: tc, rc: rc}
}

// Write writes b, as net.TCPConn's does; while the socket's buffer has no room for
// what is left, the connection is full.
func (s *stallConn) Write(b []byte) (int, error) {
	var (
		n    int
		werr error
	)
	err := s.rc.Write(func(fd uintptr) bool {
		for n < len(b) && werr == nil {
			k, err := unix.Write(int(fd), b[n:])
			if k > 0 {
				n += k
			}
			switch {
			case err == unix.EAGAIN:
				s.full.Store(true)
				return false // the runtime's poller calls again when there is room
			case err == unix.EINTR:
			case err != nil:
				werr = err
			case k == 0:
				werr = io.ErrUnexpectedEOF
			}
		}
		s.full.Store(false)
		return true
	})
	if err == nil && werr == nil {
		return n, nil
	}
	if werr != nil {
		err = os.NewSyscallError("write", werr)
	} else if oe := (*net.OpError)(nil); errors.As(err, &oe) {
		err = oe.Err // closed, or past a deadline
	}
	return n, &net.OpError{Op: "write", Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
}

// CloseWrite shuts down the writing side of the connection.
func (s *stallConn) CloseWrite() error { return s.tcp.CloseWrite() }

// SetLinger sets the connection's linger (0: its close resets it).
func (s *stallConn) SetLinger(sec int) error { return s.tcp.SetLinger(sec) }

// SyscallConn returns the connection's raw connection, which Settle polls.
func (s *stallConn) SyscallConn() (syscall.RawConn, error) { return s.rc, nil }

// fly notes c as taken and not yet recorded (busy: being served).
func (g *Gateway) fly(c net.Conn, busy bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.flights == nil {
		g.flights = map[net.Conn]*flight{}
	}
	if f, ok := g.flights[c]; ok {
		f.busy = busy
	} else {
		g.flights[c] = &flight{busy: busy}
	}
	if !busy {
		g.signalSettled()
	}
}

// dialing notes that c's relay is connecting to its host: Settle waits for that.
func (g *Gateway) dialing(c net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.flights[c]; ok {
		f.dialing = true
	}
}

// relayed notes host as c's relay's connection to the host, the dial over.
func (g *Gateway) relayed(c, host net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.flights[c]; ok {
		f.host, f.dialing = host, false
	}
}

// sendsOn notes host as the connection to the host that the request being served on c
// is sent on (nil: none, or the host has begun to answer).
func (g *Gateway) sendsOn(c, host net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.flights[c]; ok {
		f.host = host
	}
}

// sandboxEnded notes that c's relay has read the sandbox's end, and wakes a Settle.
func (g *Gateway) sandboxEnded(c net.Conn) {
	g.mu.Lock()
	if f, ok := g.flights[c]; ok {
		f.ended = true
	}
	g.mu.Unlock()
	g.signalSettled()
}

// land notes c as recorded (or gone), and wakes a Settle.
func (g *Gateway) land(c net.Conn) {
	g.mu.Lock()
	delete(g.flights, c)
	g.mu.Unlock()
	g.signalSettled()
}

// signalSettled wakes a waiting Settle.
func (g *Gateway) signalSettled() {
	select {
	case g.settled <- struct{}{}:
	default:
	}
}

// connState is an egress HTTP server's http.Server.ConnState: a connection is in
// flight from its accept to its close, busy while a request on it is served (the
// handler records the request before it returns).
func (g *Gateway) connState(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew, http.StateIdle:
		g.fly(c, false)
	case http.StateActive:
		g.fly(c, true)
	case http.StateHijacked, http.StateClosed:
		g.land(c)
	}
}

// connKey is the context key under which an egress HTTP server's request finds the
// sandbox's connection it came on (connContext).
type connKey struct{}

// connContext is an egress HTTP server's http.Server.ConnContext: a request's context
// carries the connection it came on, whose flight the handler notes (sendsOn).
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// flownListener is a listener of an egress service (its HTTP, TLS or plain TCP port):
// each connection it accepts is in flight (fly) before Accept returns it, and Settle
// can fence it (fence): a connection the kernel handed to the accept loop is in
// neither the listener's queue nor the flights until then.
type flownListener struct {
	net.Listener
	g *Gateway
	// dl sets the listener's deadline; nil when it has none (it cannot be fenced, and
	// Settle cannot see its queue either).
	dl interface{ SetDeadline(time.Time) error }
	// dialsAtOnce: each connection's handler dials its host before anything else (a
	// plain TCP port), so the connection is noted dialling from its accept.
	dialsAtOnce bool
	// accepted, when set (tests), is called with each connection the kernel handed over,
	// before it is in flight.
	accepted func(net.Conn)

	mu           sync.Mutex
	asked, acked uint64        // fences asked for, and answered by the accept loop
	ack          chan struct{} // closed (and replaced) when the loop answers
	done         chan struct{} // closed when Accept failed for good: no loop to answer
	doneOnce     sync.Once
}

// aLongTimeAgo is a deadline in the past: it wakes a blocked Accept at once.
var aLongTimeAgo = time.Unix(1, 0)

// flown wraps l, an egress service's listener, for its one accept loop.
func (g *Gateway) flown(l net.Listener) *flownListener {
	fl := &flownListener{Listener: l, g: g, ack: make(chan struct{}), done: make(chan struct{})}
	fl.dl, _ = l.(interface{ SetDeadline(time.Time) error })
	g.fenced = append(g.fenced, fl)
	return fl
}

// Accept returns l's next connection, in flight. A fence's deadline wakes it: it
// answers the fence (every connection it returned before is in flight) and accepts on.
func (l *flownListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			c = watchStalls(c)
			if l.accepted != nil {
				l.accepted(c)
			}
			l.g.fly(c, false)
			if l.dialsAtOnce {
				l.g.dialing(c) // before the handler runs: no gap for a Settle to see
			}
			return c, nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && l.answer() {
			continue
		}
		l.doneOnce.Do(func() { close(l.done) })
		return nil, err
	}
}

// answer answers the fences asked for so far and lifts their deadline; false when none
// was asked (the timeout was not a fence's).
func (l *flownListener) answer() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.asked == l.acked {
		return false
	}
	_ = l.dl.SetDeadline(time.Time{})
	l.acked = l.asked
	close(l.ack)
	l.ack = make(chan struct{})
	return true
}

// ask asks the accept loop for a fence: it wakes the loop, which answers once every
// connection the kernel handed it so far is in flight. The deadline is set under the
// lock answer lifts it under, so a fence asked for while the loop answers another is
// either answered with it or wakes the loop again. It returns the fence's number, for
// await; 0 when l cannot be fenced.
func (l *flownListener) ask() uint64 {
	if l.dl == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	_ = l.dl.SetDeadline(aLongTimeAgo)
	return l.asked
}

// await waits until fence want is answered (or the loop is gone), or until stop is
// closed (false then).
func (l *flownListener) await(want uint64, stop <-chan struct{}) bool {
	for {
		l.mu.Lock()
		acked, ack := l.acked, l.ack
		l.mu.Unlock()
		if acked >= want {
			return true
		}
		select {
		case <-ack:
		case <-l.done:
			return true
		case <-stop:
			return false
		}
	}
}

// fence fences every egress listener's accept loop at once (ask, then await): when it
// returns true, every connection taken from a listener's queue before it began is in
// flight. False when ctx ended or the deadline passed first.
func (g *Gateway) fence(ctx context.Context, deadline time.Time) bool {
	if len(g.fenced) == 0 {
		return true
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	want := make([]uint64, len(g.fenced))
	for i, l := range g.fenced {
		want[i] = l.ask()
	}
	for i, l := range g.fenced {
		if !l.await(want[i], ctx.Done()) {
			return false
		}
	}
	return true
}
