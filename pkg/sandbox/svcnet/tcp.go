package svcnet

import (
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// MethodTCP is Request.Method of a plain TCP connection relayed on one of an egress
// service's TCP ports.
const MethodTCP = "TCP"

// tcpPort is one plain TCP port of an egress service: the one host it is declared for,
// and where that host's port is reached.
type tcpPort struct {
	svc  string
	host string
	port int
	addr string
}

// newTCPPort maps port hp of egress service s: where the runtime says
// (sandbox.HostMapper), else the host's own name.
func newTCPPort(rt sandbox.Runtime, s sandbox.Service, hp sandbox.HostPort) tcpPort {
	addr := net.JoinHostPort(hp.Host, strconv.Itoa(hp.Port))
	if hm, ok := rt.(sandbox.HostMapper); ok {
		if a, ok := hm.HostUpstream(hp.Host, hp.Port); ok {
			addr = a
		}
	}
	return tcpPort{svc: s.Name, host: hp.Host, port: hp.Port, addr: addr}
}

// serveTCPPort accepts the connections of one plain TCP port of an egress service and
// relays each, unread, to the one host the port is declared for, whatever name the
// sandbox connected by (a plain stream names none), through the fault connection layer
// (one decision per connection, keyed "tcp/<host>:<port>/<n>" by accept order, selected
// by the rules for the service and the host). Each is recorded as a TLS connection is
// (host, port, bytes each way, the faults met), with method "TCP". A port no service
// declares has no listener: the sandbox's kernel refuses the connection.
func (g *Gateway) serveTCPPort(l *flownListener, p tcpPort) {
	prefix := "tcp/" + net.JoinHostPort(p.host, strconv.Itoa(p.port)) + "/"
	g.serveEach(l, func(c net.Conn, n uint64, at int64) {
		key := prefix + strconv.FormatUint(n, 10)
		g.relayStream(c, p.svc, Request{Host: p.host, Port: p.port, Method: MethodTCP, at: at}, key, p.addr, nil, true)
	})
}

// serveEach accepts l's connections until l is closed and handles each on a goroutine of
// the gateway's, tracked so that Close ends it, and closed when handle returns; n counts
// the connections accepted, from 0, at is when it was accepted (Request.at). Each is in
// flight for Settle from its accept (l's) until it is recorded (land) or handle
// returns. The caller has added this call to g.wg.
func (g *Gateway) serveEach(l *flownListener, handle func(c net.Conn, n uint64, at int64)) {
	defer g.wg.Done()
	var accepted uint64
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		at := time.Now().UnixNano()
		if !g.track(c, true) {
			g.land(c)
			_ = c.Close()
			return
		}
		n := accepted
		accepted++
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.track(c, false)
			defer g.land(c)
			defer c.Close()
			handle(c, n, at)
		}()
	}
}
