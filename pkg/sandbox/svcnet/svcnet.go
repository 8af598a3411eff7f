// Package svcnet attaches a sandbox's declared services (sandbox.Spec.Services) for one
// episode: for each service it opens a listener inside the sandbox's
// network namespace (through the runtime's sandbox.ServiceListener) and forwards from the
// host process to the service's upstream, through gauntlet's fault layer (package
// faultnet) driven by the episode's inject.Decider. Every fault that fires is reported
// (Options.OnFire; a Recorder turns them into step events).
//
// HTTP services go through a faultnet.Proxy, one decision per request keyed
// "http/<service>" (the service name, whatever host the client wrote), so the network
// kinds act per request there too: latency before the answer, a reset after N bytes of
// the response, a timeout, a lost request costing one RTO, a bandwidth cap on the body;
// and the service kinds rewrite or replace the answer. TCP services go through
// faultnet.WrapConn, keyed "conn/<service>/<n>" by accept order: one decision when the
// connection opens (reset after N bytes or ms, black hole, bandwidth, a lost SYN) and one
// per write back to the sandbox (latency, loss).
//
// The sandbox's name server answers there too: a faultnet.DNSServer on the
// sandbox's 127.0.0.53:53 (UDP and TCP, opened through the runtime's
// sandbox.ResolverListener) resolves the service names (and localhost, sandbox) to
// 127.0.0.1 and every other name to NXDOMAIN, without recursion, unless the decider's
// dns_nxdomain, dns_servfail or dns_timeout fires; one lookup is one event keyed
// "dns/<name>", with Service set when the name is a service's.
//
// The gateway is strictly a reverse proxy to the declared upstream: absolute-form
// requests (a client treating it as a forward proxy) and CONNECT are refused, so
// attaching services opens no path to anywhere else.
//
// An egress service (sandbox.ProtocolEgress) is a task's allow-list: its hosts resolve to
// the sandbox's loopback, where its gateway proxies plain HTTP to them alone, through the
// same fault proxy (keyed "http/<host>"), and relays TLS on its TLS ports (443 and
// others) to the host the ClientHello names, unopened, through the fault connection
// layer (keyed "tls/<host>:<port>/<n>"), and relays plain TCP on its TCP ports, each
// declared for one host, to that host (keyed "tcp/<host>:<port>/<n>"). It reports every
// request and connection (Options.OnRequest: host, port, method, path, status, bytes each
// way, the faults met, denied or not). A request naming another host is refused with 403, a TLS connection
// naming another host with an access_denied alert, and a lookup of a name the name
// server does not hold is reported as denied, and so is a connection or datagram to a
// loopback port nothing declares, which the sandbox's kernel refuses (the gateway reads
// those refusals on the sandbox's lo, through the runtime's sandbox.RefusalWatcher), so
// what a sandbox tried to reach is in the record too. An attempt at a bare address never
// reaches the sandbox's loopback (the runtime's seccomp supervisor refuses it): an env
// passes the command's sandbox.ExecResult.Egress to Recorder.OnEgress, which records each
// as denied under the same cap. A profile's packet_loss meets a
// relayed TLS or TCP stream segment by segment (faultnet.WrapStream): each lost segment
// holds the stream one RTO and is reported as a fault.
//
// The gateway records on its own goroutines, which may come to a connection after the
// sandbox's command has returned: an env calls Gateway.Settle at the end of each step,
// which returns once what the sandbox did until then is recorded (bounded by
// Options.SettleWait), and a Recorder orders a step's requests by when they began, so
// the same actions give the same record.
package svcnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultnet"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Options configure a gateway.
type Options struct {
	// Decider decides the faults (nil: none; traffic passes through).
	Decider *inject.Decider
	// OnFire receives every fault that fires (optional).
	OnFire faultnet.OnFire
	// OnRequest receives every request through an egress service's gateway and every
	// refused lookup of a sandbox with one (optional; Recorder.OnRequest collects them).
	OnRequest func(Request)
	// DialTimeout bounds connecting to an upstream (default 5 s).
	DialTimeout time.Duration
	// Logger receives serving errors (default slog.Default()).
	Logger *slog.Logger
	// SettleWait bounds how long Settle waits for what is under way (default
	// DefaultSettleWait), and how long a relayed TLS connection's host has to end it
	// after the sandbox ended its side.
	SettleWait time.Duration
}

// Gateway forwards a sandbox's services for as long as it is open.
type Gateway struct {
	opt       Options
	listeners []net.Listener
	servers   []*http.Server
	dns       *faultnet.DNSServer
	refusals  *os.File // an egress service's: the refusals on the sandbox's loopback
	wg        sync.WaitGroup
	settled   chan struct{}    // a flight landed (capacity 1): wakes a Settle
	fenced    []*flownListener // the egress listeners' accept loops, fenced by Settle

	refMu          sync.Mutex // one reader of refusals at a time: the watch's or Settle's
	refBuf, refOOB []byte

	mu      sync.Mutex
	conns   map[net.Conn]struct{} // open TCP-service connections, closed by Close
	flights map[net.Conn]*flight  // connections taken and not yet recorded, for Settle
	closed  bool
}

// Attach starts forwarding the services of sandbox id (the spec's Services) on rt,
// which must implement sandbox.ServiceListener. Close stops it.
func Attach(ctx context.Context, rt sandbox.Runtime, id string, services []sandbox.Service, opt Options) (*Gateway, error) {
	sl, ok := rt.(sandbox.ServiceListener)
	if !ok {
		return nil, fmt.Errorf("attach services to %s: %w: runtime %s cannot listen inside its sandboxes", id, sandbox.ErrUnsupported, rt.Name())
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = 5 * time.Second
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.SettleWait <= 0 {
		opt.SettleWait = DefaultSettleWait
	}
	g := &Gateway{opt: opt, conns: map[net.Conn]struct{}{}, settled: make(chan struct{}, 1)}
	if len(services) > 0 {
		if err := g.serveDNS(ctx, rt, id, services); err != nil {
			return nil, err
		}
	}
	for _, s := range services {
		l, err := sl.ListenService(ctx, id, s.Port)
		if err != nil {
			_ = g.Close()
			return nil, fmt.Errorf("attach service %s to %s: %w", s.Name, id, err)
		}
		g.listeners = append(g.listeners, l)
		if s.Protocol == sandbox.ProtocolTCP {
			g.wg.Add(1)
			go g.serveTCP(l, s)
			continue
		}
		h := g.httpHandler(s)
		if s.Protocol == sandbox.ProtocolEgress {
			h = g.egressHandler(rt, s)
			for _, port := range s.TLSPorts {
				tl, err := sl.ListenService(ctx, id, port)
				if err != nil {
					_ = g.Close()
					return nil, fmt.Errorf("attach service %s to %s: port %d: %w", s.Name, id, port, err)
				}
				g.listeners = append(g.listeners, tl)
				g.wg.Add(1)
				go g.serveTLS(g.flown(tl), newTLSPort(rt, s, port))
			}
			for _, hp := range s.TCPPorts {
				tl, err := sl.ListenService(ctx, id, hp.Port)
				if err != nil {
					_ = g.Close()
					return nil, fmt.Errorf("attach service %s to %s: port %d: %w", s.Name, id, hp.Port, err)
				}
				g.listeners = append(g.listeners, tl)
				g.wg.Add(1)
				fl := g.flown(tl)
				fl.dialsAtOnce = true
				go g.serveTCPPort(fl, newTCPPort(rt, s, hp))
			}
			// The refusals are watched for a recorder: without one they would go nowhere.
			if rw, ok := rt.(sandbox.RefusalWatcher); ok && opt.OnRequest != nil && g.refusals == nil {
				f, err := rw.WatchRefusals(ctx, id)
				if err != nil {
					_ = g.Close()
					return nil, fmt.Errorf("attach service %s to %s: %w", s.Name, id, err)
				}
				g.refusals = f
				g.wg.Add(1)
				go g.serveRefusals(f)
			}
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(opt.Logger.Handler(), slog.LevelDebug)}
		var sl net.Listener = l
		if s.Protocol == sandbox.ProtocolEgress {
			srv.ConnState = g.connState // its requests are recorded: Settle waits for them
			srv.ConnContext = connContext
			sl = g.flown(l)
		}
		g.servers = append(g.servers, srv)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := srv.Serve(sl); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				opt.Logger.Warn("service gateway stopped", "sandbox", id, "service", s.Name, "err", err)
			}
		}()
	}
	return g, nil
}

// serveDNS starts the sandbox's name server.
func (g *Gateway) serveDNS(ctx context.Context, rt sandbox.Runtime, id string, services []sandbox.Service) error {
	rl, ok := rt.(sandbox.ResolverListener)
	if !ok {
		return fmt.Errorf("attach services to %s: %w: runtime %s cannot serve names inside its sandboxes", id, sandbox.ErrUnsupported, rt.Name())
	}
	pc, l, err := rl.ListenResolver(ctx, id)
	if err != nil {
		return fmt.Errorf("attach services to %s: name server: %w", id, err)
	}
	lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	hosts := map[string][]netip.Addr{"localhost": {lo4, lo6}, "sandbox": {lo4}}
	names := map[string]string{}
	egress := false
	for _, s := range services {
		hosts[s.Name] = []netip.Addr{lo4}
		names[s.Name] = s.Name
		if s.Protocol == sandbox.ProtocolEgress {
			egress = true
			for _, h := range s.Hosts {
				hosts[h] = []netip.Addr{lo4}
				names[h] = s.Name
			}
		}
	}
	g.dns = &faultnet.DNSServer{D: g.opt.Decider, OnFire: g.opt.OnFire, Hosts: hosts, Services: names, Logger: g.opt.Logger}
	if egress {
		g.dns.OnUnknown = func(name string) {
			g.request(Request{Host: name, Method: MethodDNS, Denied: true, at: time.Now().UnixNano()})
		}
	}
	for _, serve := range []func() error{func() error { return g.dns.ServePacket(pc) }, func() error { return g.dns.Serve(l) }} {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := serve(); err != nil {
				g.opt.Logger.Warn("sandbox name server stopped", "sandbox", id, "err", err)
			}
		}()
	}
	return nil
}

// httpHandler is the reverse proxy of one HTTP service.
func (g *Gateway) httpHandler(s sandbox.Service) http.Handler {
	up := &url.URL{Scheme: "http", Host: s.Upstream}
	nd := &net.Dialer{Timeout: g.opt.DialTimeout}
	p := &faultnet.Proxy{
		D:         g.opt.Decider,
		OnFire:    g.opt.OnFire,
		Upstreams: map[string]*url.URL{s.Name: up},
		Services:  map[string]string{s.Name: s.Name},
		// A plain transport: the faults act once, in the proxy, not again on the
		// upstream connection.
		Transport: &http.Transport{DialContext: nd.DialContext, DisableCompression: true, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect || r.URL.IsAbs() || r.URL.Host != "" {
			http.Error(w, "gauntlet gateway: "+s.Name+" is a service, not a proxy", http.StatusForbidden)
			return
		}
		// Route and key by the service, whatever name or address the client used.
		r.Host = s.Name
		p.ServeHTTP(w, r)
	})
}

// serveTCP accepts connections of a TCP service and forwards each to the upstream.
func (g *Gateway) serveTCP(l net.Listener, s sandbox.Service) {
	defer g.wg.Done()
	for n := uint64(0); ; n++ {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		key := "conn/" + s.Name + "/" + strconv.FormatUint(n, 10)
		fc := faultnet.WrapConn(c, g.opt.Decider, key, catalogue.Event{Service: s.Name, Host: s.Name}, g.opt.OnFire)
		if !g.track(fc, true) {
			_ = fc.Close()
			return
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.track(fc, false)
			g.forward(fc, s)
		}()
	}
}

func (g *Gateway) track(c net.Conn, add bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if add {
		if g.closed {
			return false
		}
		g.conns[c] = struct{}{}
	} else {
		delete(g.conns, c)
	}
	return true
}

// forward copies between the sandbox's connection and a new upstream connection, passing
// half-closes on, until both directions end (or one fails, which ends both).
func (g *Gateway) forward(c *faultnet.Conn, s sandbox.Service) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", s.Upstream, g.opt.DialTimeout)
	if err != nil {
		g.opt.Logger.Debug("service upstream unreachable", "service", s.Name, "err", err)
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(up, c); err != nil {
			_ = up.Close()
			return
		}
		_ = up.(*net.TCPConn).CloseWrite()
	}()
	if _, err := io.Copy(c, up); err != nil {
		_ = c.Close()
	} else if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	<-done
}

// Close stops the listeners, ends open connections and waits for the forwarding to stop.
func (g *Gateway) Close() error {
	g.mu.Lock()
	g.closed = true
	conns := make([]net.Conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	var errs []error
	if g.dns != nil {
		_ = g.dns.Close() // closes its sockets
	}
	for _, srv := range g.servers {
		_ = srv.Close() // closes its listener
	}
	for _, l := range g.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if g.refusals != nil {
		_ = g.refusals.Close()
	}
	for _, c := range conns {
		_ = c.Close()
	}
	g.wg.Wait()
	return errors.Join(errs...)
}
