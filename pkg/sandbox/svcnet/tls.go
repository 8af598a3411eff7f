package svcnet

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// MethodTLS is Request.Method of a TLS connection relayed (or refused) on one of an
// egress service's TLS ports.
const MethodTLS = "TLS"

// helloTimeout bounds how long a connection to a TLS port may take to send its
// ClientHello (clients send it at once).
const helloTimeout = 10 * time.Second

// accessDenied is a TLS fatal alert record, access_denied: what a client connecting to a
// host it may not reach reads (curl: "tlsv1 alert access denied").
var accessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}

// tlsPort is one TLS port of an egress service: its allowed hosts and where each is
// reached on that port.
type tlsPort struct {
	svc  string
	port int
	ups  map[string]string // allowed host -> host:port the host process dials
	mu   sync.Mutex
	next map[string]uint64 // per host: connections relayed so far, for fault keys
}

// newTLSPort maps the hosts of egress service s on port: where the runtime says
// (sandbox.HostMapper), else the host's own name.
func newTLSPort(rt sandbox.Runtime, s sandbox.Service, port int) *tlsPort {
	hm, _ := rt.(sandbox.HostMapper)
	p := &tlsPort{svc: s.Name, port: port, ups: make(map[string]string, len(s.Hosts)), next: map[string]uint64{}}
	for _, h := range s.Hosts {
		addr := net.JoinHostPort(h, strconv.Itoa(port))
		if hm != nil {
			if a, ok := hm.HostUpstream(h, port); ok {
				addr = a
			}
		}
		p.ups[h] = addr
	}
	return p
}

// serveTLS accepts the connections of one TLS port of an egress service. Each one must
// open with a ClientHello whose server name (SNI) is an allowed host: it is then relayed,
// unopened, to that host, through the fault connection layer (faultnet.WrapStream: one
// decision per connection, keyed "tls/<host>:<port>/<n>" by the order the host's
// connections on that port named it, and selected by the rules for the service and the
// host), and recorded when the sandbox closes it (host, port, bytes each way, the faults
// met). A connection naming another host, none, or not
// speaking TLS is refused (an access_denied alert where it spoke TLS) and recorded as
// denied. The gateway never terminates TLS: the sandbox talks to the host's own
// certificate, so HTTP-level faults (status codes, truncated bodies) cannot apply here.
func (g *Gateway) serveTLS(l *flownListener, p *tlsPort) {
	g.serveEach(l, func(c net.Conn, _ uint64, at int64) { g.relayTLS(c, p, at) })
}

// relayTLS reads c's ClientHello, checks its server name, and relays the connection to
// the host it names.
func (g *Gateway) relayTLS(c net.Conn, p *tlsPort, at int64) {
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	hello, name, err := readClientHello(c)
	_ = c.SetReadDeadline(time.Time{})
	req := Request{Host: name, Port: p.port, Method: MethodTLS, BytesUp: int64(len(hello)), at: at}
	if err != nil {
		if g.isClosed() {
			return // the gateway closed the connection: nothing the sandbox did
		}
		req.Denied, req.Error = true, err.Error()
		g.request(req)
		return
	}
	addr, ok := p.ups[name]
	if !ok {
		// Recorded before the sandbox reads the refusal, so with the command it ends.
		req.Denied, req.Error = true, "host not allowed in this sandbox"
		g.request(req)
		_, _ = c.Write(accessDenied)
		return
	}
	p.mu.Lock()
	n := p.next[name]
	p.next[name]++
	p.mu.Unlock()
	key := "tls/" + net.JoinHostPort(name, strconv.Itoa(p.port)) + "/" + strconv.FormatUint(n, 10)
	g.relayStream(c, p.svc, req, key, addr, hello, false)
}

// relayStream relays c, whose first bytes (already read from it) are first, to addr,
// through the fault connection layer (faultnet.WrapStream: one decision when it opens,
// keyed key, selected by the rules for service svc and for req.Host), and records req
// with its bytes each way and the faults it met. The connection is recorded once, and
// Settle waits for that while the sandbox's side has something unread (its end
// included), so that it is recorded with the command that made it: a TLS connection
// (readsOn false) when the relay ends, with every byte the host sent (its answer to the
// sandbox's close too: a count that does not depend on which goroutine runs first); the
// host has Options.SettleWait from the sandbox's end to end its side, else the relay
// ends there. A plain TCP one (readsOn: its client may close its side and read on) is
// recorded when the host ends its side, before that end is passed on (bytes the
// sandbox sends after it are not counted), or when the relay ends, if that is first.
func (g *Gateway) relayStream(c net.Conn, svc string, req Request, key, addr string, first []byte, readsOn bool) {
	var (
		mu     sync.Mutex
		once   sync.Once
		up     atomic.Int64
		fc     *faultnet.Conn
		faults []string
	)
	up.Store(int64(len(first)))
	record := func() {
		once.Do(func() {
			mu.Lock()
			req.Faults = slices.Clone(faults)
			mu.Unlock()
			req.BytesUp, req.Bytes = up.Load(), fc.Written()
			g.request(req)
			g.land(c)
		})
	}
	fc = faultnet.WrapStream(c, g.opt.Decider, key, catalogue.Event{Service: svc, Host: req.Host}, func(key string, ev catalogue.Event, fired []catalogue.Fired) {
		ev.Service = "" // recorded on the host
		if g.opt.OnFire != nil {
			g.opt.OnFire(key, ev, fired)
		}
		mu.Lock()
		for _, f := range fired {
			// A stream's lost segments are each a fault of the step; the connection
			// names the kind once.
			if f.Kind != catalogue.KindPacketLoss || !slices.Contains(faults, f.Kind) {
				faults = append(faults, f.Kind)
			}
		}
		mu.Unlock()
	})
	// A fault that resets the connection or ends its hold records it first: the
	// sandbox, which sees that end, may be done with its command at once.
	fc.OnAbort(record)
	defer fc.Close()
	defer record()
	// Dialling until relayed, or the record of a failed dial. A plain TCP port's
	// connection is noted dialling from its accept (flownListener.dialsAtOnce); a TLS
	// port's from here, once its hello is read and parsed: a Settle between the two
	// sees nothing under way (microseconds, not a dial's wait).
	g.dialing(c)
	upc, err := net.DialTimeout("tcp", addr, g.opt.DialTimeout)
	if err != nil {
		g.opt.Logger.Debug("allowed host unreachable", "host", req.Host, "port", req.Port, "err", err)
		req.Error = "upstream unreachable"
		return
	}
	upc = watchStalls(upc) // a host that stops reading holds the sandbox's bytes, not Settle
	defer upc.Close()
	// Close ends the host's side too: a host holding it open and quiet would keep the
	// relay (and Close, which waits for it) waiting.
	if !g.track(upc, true) {
		return
	}
	defer g.track(upc, false)
	g.relayed(c, upc)
	if len(first) > 0 {
		if _, err := upc.Write(first); err != nil {
			req.Error = "upstream closed"
			return
		}
	}
	relay(fc, upc, &up, record, func() { g.sandboxEnded(c) }, readsOn, g.opt.SettleWait)
}

// relay copies between the sandbox's connection c and the upstream's until both
// directions end (or one fails, which ends both), passing half-closes on, counting the
// bytes sent upstream (the sandbox's, c.Written). If readsOn, it calls record when the
// host ends its side, just before the sandbox is told; else the caller records when it
// returns, and the host has grace from the sandbox's end to end its side. ended is
// called once the sandbox's end is read (and passed on).
func relay(c *faultnet.Conn, upc net.Conn, up *atomic.Int64, record, ended func(), readsOn bool, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := io.Copy(countWriter{upc, up}, c)
		if err != nil {
			_ = upc.Close()
			return
		}
		if !readsOn {
			// The sandbox ended its side: the host answers and ends its own, in time.
			_ = upc.SetReadDeadline(time.Now().Add(grace))
		}
		if cw, ok := upc.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		ended()
	}()
	if _, err := io.Copy(c, upc); err != nil {
		_ = c.Close()
	} else {
		if readsOn {
			record() // the host ended: record before the sandbox reads that end
		}
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}
	<-done
}

// countWriter counts the bytes written through it as they are handed on, and takes back
// what a failed write did not send: the host may answer and end the connection as soon
// as it has them, and the record made then must count them (faultnet.Conn.Written
// counts the same way).
type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countWriter) Write(b []byte) (int, error) {
	c.n.Add(int64(len(b)))
	n, err := c.w.Write(b)
	if n < len(b) {
		c.n.Add(int64(n - len(b)))
	}
	return n, err
}

// Errors of a connection to a TLS port that is refused before its host is known.
var (
	errNotTLS = errors.New("not a TLS ClientHello")
	errNoSNI  = errors.New("no server name (SNI) in the TLS ClientHello")
	// errHelloRead stops the handshake once the hello is read.
	errHelloRead = errors.New("client hello read")
)

// readClientHello reads the ClientHello c opens with (as crypto/tls parses it, records
// split or not) and returns every byte read, to be replayed to the upstream, and the
// server name it asks for, lower-case without a final dot. Nothing is written to c.
func readClientHello(c net.Conn) ([]byte, string, error) {
	var buf bytes.Buffer
	var name string
	var got bool
	err := tls.Server(helloConn{Conn: c, r: io.TeeReader(c, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, got = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	switch {
	case !got:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return buf.Bytes(), "", errors.New("no TLS ClientHello in time")
		}
		return buf.Bytes(), "", errNotTLS
	case name == "":
		return buf.Bytes(), "", errNoSNI
	}
	return buf.Bytes(), strings.ToLower(strings.TrimSuffix(name, ".")), nil
}

// helloConn is the connection crypto/tls reads a ClientHello from: reads go through r
// (which keeps a copy), writes (the alert a stopped handshake sends) go nowhere.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (h helloConn) Read(b []byte) (int, error)  { return h.r.Read(b) }
func (h helloConn) Write(b []byte) (int, error) { return len(b), nil }
func (h helloConn) Close() error                { return nil }

// isClosed reports whether Close has begun.
func (g *Gateway) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}
