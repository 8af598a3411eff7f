package svcnet_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/netns"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/process"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
)

// BenchmarkGatewayRequest measures one HTTP GET (2,000-byte answer, keep-alive) side by
// side: straight to the upstream on the host's loopback; from inside a process sandbox's
// network namespace through the gateway with no faults; and the same with the test
// profile's seven rules evaluated on every request (none fires on this path).
//
//	go test -run '^$' -bench BenchmarkGatewayRequest -count 5 ./pkg/sandbox/svcnet/
func BenchmarkGatewayRequest(b *testing.B) {
	dir := b.TempDir()
	rt, err := process.New(process.Config{StateDir: dir})
	if err != nil {
		b.Fatalf("process runtime unavailable: %v", err)
	}
	b.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	api := benchUpstream(b)
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Services: []sandbox.Service{{Name: "api", Port: 8080, Upstream: api}}})
	if err != nil {
		b.Fatal(err)
	}
	_, rules, err := plans.ParseSpec([]byte(profile))
	if err != nil {
		b.Fatal(err)
	}
	ns := filepath.Join(dir, "netns", h.ID)
	inside := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return netns.Dial(ctx, ns, network, addr)
	}}}
	get := func(b *testing.B, c *http.Client, url string) {
		for b.Loop() {
			resp, err := c.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := io.Copy(io.Discard, resp.Body); n != bodyLen {
				b.Fatalf("%d bytes", n)
			}
			resp.Body.Close()
		}
	}
	b.Run("direct", func(b *testing.B) { get(b, &http.Client{Transport: &http.Transport{}}, "http://"+api+"/ok") })
	for _, tc := range []struct {
		name string
		d    *inject.Decider
	}{{"gateway", nil}, {"gateway-7-rules", inject.NewDecider(1, rules)}} {
		b.Run(tc.name, func(b *testing.B) {
			g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{Decider: tc.d})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			get(b, inside, "http://127.0.0.1:8080/ok")
			inside.CloseIdleConnections()
		})
	}
}

func benchUpstream(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, bodyLen)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) })}
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// BenchmarkEgressRequest measures one HTTP GET (2,000-byte answer, keep-alive) to an
// allowed host from inside a process sandbox's network namespace, through the egress
// gateway (the host check, the fault proxy with the egress test profile's five rules, and
// the request's record), beside the same GET straight to the upstream.
//
//	go test -run '^$' -bench BenchmarkEgressRequest -count 5 ./pkg/sandbox/svcnet/
func BenchmarkEgressRequest(b *testing.B) {
	dir := b.TempDir()
	rt, h, api := egressBox(b, dir)
	ctx := context.Background()
	_, rules, err := plans.ParseSpec([]byte(egressProfile))
	if err != nil {
		b.Fatal(err)
	}
	ns := filepath.Join(dir, "netns", h.ID)
	inside := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return netns.Dial(ctx, ns, network, "127.0.0.1:80") // where the host resolves in the sandbox
	}}}
	get := func(b *testing.B, c *http.Client, url string) {
		for b.Loop() {
			resp, err := c.Get(url)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := io.Copy(io.Discard, resp.Body); n != bodyLen {
				b.Fatalf("%d bytes", n)
			}
			resp.Body.Close()
		}
	}
	b.Run("direct", func(b *testing.B) { get(b, &http.Client{Transport: &http.Transport{}}, "http://"+api+"/ok") })
	b.Run("egress-5-rules", func(b *testing.B) {
		rec := &svcnet.Recorder{}
		g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{Decider: inject.NewDecider(1, rules), OnFire: rec.OnFire, OnRequest: rec.OnRequest})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		get(b, inside, "http://"+remoteHost+"/ok")
		inside.CloseIdleConnections()
		if n := len(rec.TakeRequests()); n < b.N {
			b.Fatalf("%d requests recorded of %d", n, b.N)
		}
	})
	// Unrecorded: no request records and no refusal watch on the sandbox's loopback
	// (whose kernel filter every loopback packet of the recorded case meets).
	b.Run("egress-5-rules-unrecorded", func(b *testing.B) {
		g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{Decider: inject.NewDecider(1, rules)})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		get(b, inside, "http://"+remoteHost+"/ok")
		inside.CloseIdleConnections()
	})
}

// BenchmarkEgressTLS measures one HTTPS GET on a new connection (TLS 1.3 handshake,
// 2,000-byte answer) to an allowed host from inside a process sandbox's network
// namespace, relayed by the egress gateway (the ClientHello read, the server name
// checked, the fault decision with the TLS test profile's rules, the relay and the
// connection's record), beside the same GET straight to the upstream.
//
//	go test -run '^$' -bench BenchmarkEgressTLS -count 5 ./pkg/sandbox/svcnet/
func BenchmarkEgressTLS(b *testing.B) {
	dir := b.TempDir()
	addr, certPEM := tlsRemote(b)
	rt, err := process.New(process.Config{StateDir: dir, Hosts: sandbox.HostMap{remoteHost + ":443": addr}})
	if err != nil {
		b.Fatalf("process runtime unavailable: %v", err)
	}
	b.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Services: []sandbox.Service{{Name: "egress", Port: 80, Protocol: sandbox.ProtocolEgress, Hosts: []string{remoteHost}, TLSPorts: []int{443}}}})
	if err != nil {
		b.Fatal(err)
	}
	_, rules, err := plans.ParseSpec([]byte(tlsProfile))
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(certPEM))
	client := func(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
		return &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: remoteHost}}}
	}
	get := func(b *testing.B, c *http.Client) {
		for b.Loop() {
			resp, err := c.Get("https://" + remoteHost + "/ok")
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := io.Copy(io.Discard, resp.Body); n != bodyLen {
				b.Fatalf("%d bytes", n)
			}
			resp.Body.Close()
		}
	}
	var d net.Dialer
	b.Run("direct", func(b *testing.B) {
		get(b, client(func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		}))
	})
	ns := filepath.Join(dir, "netns", h.ID)
	b.Run("egress-relay", func(b *testing.B) {
		rec := &svcnet.Recorder{}
		g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{Decider: inject.NewDecider(1, rules), OnFire: rec.OnFire, OnRequest: rec.OnRequest})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		get(b, client(func(ctx context.Context, network, _ string) (net.Conn, error) {
			return netns.Dial(ctx, ns, network, "127.0.0.1:443") // where the host resolves in the sandbox
		}))
	})
}

// unwatched is a runtime without the sandbox.RefusalWatcher ability: a gateway attached
// through it watches no refusals, and is otherwise the same.
type unwatched struct {
	sandbox.Runtime
	sandbox.ServiceListener
	sandbox.ResolverListener
	sandbox.HostMapper
}

// BenchmarkRefusalWatch measures what the refusal watch (a packet socket on the
// sandbox's loopback with its kernel filter, and the goroutine reading it) costs a
// sandbox with allowed hosts whose commands use no network, with the watch and without
// it, the gateway recording in both: "exec" runs `true` in the sandbox (a step with no
// network), "attach" attaches the gateway (where the watch's socket is opened) and
// "close" closes it, each once per episode.
//
//	go test -run '^$' -bench BenchmarkRefusalWatch -count 5 ./pkg/sandbox/svcnet/
func BenchmarkRefusalWatch(b *testing.B) {
	rt, h, _ := egressBox(b, b.TempDir())
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		rt   sandbox.Runtime
	}{{"watched", rt}, {"unwatched", unwatched{rt, rt, rt, rt}}} {
		attach := func(b *testing.B) *svcnet.Gateway {
			rec := &svcnet.Recorder{}
			g, err := svcnet.Attach(ctx, tc.rt, h.ID, h.Spec.Services, svcnet.Options{OnFire: rec.OnFire, OnRequest: rec.OnRequest})
			if err != nil {
				b.Fatal(err)
			}
			return g
		}
		b.Run("exec/"+tc.name, func(b *testing.B) {
			g := attach(b)
			defer g.Close()
			for b.Loop() {
				res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"true"}})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("exec: %v %+v", err, res)
				}
			}
		})
		b.Run("attach/"+tc.name, func(b *testing.B) {
			for b.Loop() {
				g := attach(b)
				b.StopTimer()
				if err := g.Close(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run("close/"+tc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				g := attach(b)
				b.StartTimer()
				if err := g.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSettle measures the barrier at a step's end (Gateway.Settle) on the two
// commonest steps of a sandbox with allowed hosts: "quiet" runs `true` (no network),
// "request" runs one HTTP GET to the allowed host (busybox wget); each "settled" (the
// command, then Settle, as a task env's step does) beside "unsettled" (the command
// alone). "held" runs `true` while a plain TCP connection the sandbox ended is held
// open and quiet by its host (a step before opened it; its own Settle is not timed).
// "stalled" runs `true` while a plain TCP connection the sandbox opened and stopped
// reading is streamed to by its host without end (the relay's writes wait for the
// sandbox; opened before, its Settle not timed; closed after). "stalled-host" is its
// mirror: `true` while a plain TCP connection the sandbox opened sends without end to a
// host that reads nothing (the relay's writes wait for the host; opened before, its
// Settle not timed; closed after, the relay left waiting for the host until the
// benchmark ends). settle-µs is the mean time of the Settle call alone.
//
//	go test -run '^$' -bench BenchmarkSettle -benchtime 30x -count 5 ./pkg/sandbox/svcnet/
func BenchmarkSettle(b *testing.B) {
	api := benchUpstream(b)
	hold := holdUpstream(b)
	stream := streamHost(b, math.MaxInt64)
	sink := holdUpstream(b) // holds every connection and reads nothing
	dir := b.TempDir()
	rt, err := process.New(process.Config{StateDir: dir, Hosts: sandbox.HostMap{remoteHost: api, holdHost + ":7000" + sandbox.TCPSuffix: hold,
		streamingHost + ":7001" + sandbox.TCPSuffix: stream, sinkHost + ":7002" + sandbox.TCPSuffix: sink}})
	if err != nil {
		b.Fatalf("process runtime unavailable: %v", err)
	}
	b.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	ctx := context.Background()
	h, err := rt.Create(ctx, sandbox.Spec{Services: []sandbox.Service{{Name: "egress", Port: 80, Protocol: sandbox.ProtocolEgress,
		Hosts:    []string{remoteHost, holdHost, streamingHost, sinkHost},
		TCPPorts: []sandbox.HostPort{{Host: holdHost, Port: 7000}, {Host: streamingHost, Port: 7001}, {Host: sinkHost, Port: 7002}}}}})
	if err != nil {
		b.Fatal(err)
	}
	rec := &svcnet.Recorder{}
	g, err := svcnet.Attach(ctx, rt, h.ID, h.Spec.Services, svcnet.Options{OnFire: rec.OnFire, OnRequest: rec.OnRequest})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	exec := func(b *testing.B, argv ...string) {
		res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: argv})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec %q: %v %+v", argv, err, res)
		}
	}
	for _, step := range []struct {
		name  string
		argv  []string
		setup func(b *testing.B) (done func()) // done, if not nil, ends what setup opened
	}{
		{"quiet", []string{"true"}, nil},
		{"request", []string{"busybox", "wget", "-q", "-O", "/dev/null", "http://" + remoteHost + "/"}, nil},
		{"held", []string{"true"}, func(b *testing.B) func() {
			// nc sends its end at once (no input) and reads on until timeout kills it.
			exec(b, "sh", "-c", "timeout 1 busybox nc "+holdHost+" 7000 </dev/null; true")
			return nil
		}},
		{"stalled", []string{"true"}, func(b *testing.B) func() {
			c, err := netns.Dial(ctx, filepath.Join(dir, "netns", h.ID), "tcp", "127.0.0.1:7001")
			if err != nil {
				b.Fatal(err)
			}
			return func() { _ = c.Close() } // unread bytes: reset, and recorded
		}},
		{"stalled-host", []string{"true"}, func(b *testing.B) func() {
			c, err := netns.Dial(ctx, filepath.Join(dir, "netns", h.ID), "tcp", "127.0.0.1:7002")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _, _ = io.Copy(c, zeros{}) }() // until c is closed
			return func() { _ = c.Close() }
		}},
	} {
		for _, settled := range []bool{true, false} {
			name := step.name + "/unsettled"
			if settled {
				name = step.name + "/settled"
			}
			b.Run(name, func(b *testing.B) {
				if step.setup != nil {
					done := step.setup(b)
					g.Settle(ctx)
					_ = rec.TakeRequests()
					if done != nil {
						defer func() {
							done()
							g.Settle(ctx)
							_ = rec.TakeRequests()
						}()
					}
				}
				var settle time.Duration
				for b.Loop() {
					exec(b, step.argv...)
					if settled {
						start := time.Now()
						g.Settle(ctx)
						settle += time.Since(start)
					}
					_ = rec.TakeRequests()
				}
				if settled {
					b.ReportMetric(float64(settle.Microseconds())/float64(b.N), "settle-µs")
				}
			})
		}
	}
}

// holdHost is the allowed host of BenchmarkSettle's "held" step, whose TCP port 7000
// holdUpstream serves.
const holdHost = "hold.example.test"

// streamingHost is the allowed host of BenchmarkSettle's "stalled" step, whose TCP port
// 7001 a streamHost serves without end.
const streamingHost = "stream.example.test"

// sinkHost is the allowed host of BenchmarkSettle's "stalled-host" step, whose TCP port
// 7002 a holdUpstream serves: it reads nothing.
const sinkHost = "sink.example.test"

// zeros reads as an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// holdUpstream is a TCP server that takes every connection and holds it open and quiet
// until the benchmark ends; it returns its address.
func holdUpstream(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range held {
					_ = c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	b.Cleanup(func() { _ = l.Close(); <-done })
	return l.Addr().String()
}

// egressBox opens a process runtime (its state in dir) whose allowed host remoteHost is a benchUpstream
// (api, its address) and creates one sandbox with an egress service for that host.
func egressBox(b *testing.B, dir string) (rt *process.Runtime, h sandbox.Handle, api string) {
	b.Helper()
	api = benchUpstream(b)
	rt, err := process.New(process.Config{StateDir: dir, Hosts: sandbox.HostMap{remoteHost: api}})
	if err != nil {
		b.Fatalf("process runtime unavailable: %v", err)
	}
	b.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	h, err = rt.Create(context.Background(), sandbox.Spec{Services: []sandbox.Service{{Name: "egress", Port: 80, Protocol: sandbox.ProtocolEgress, Hosts: []string{remoteHost}}}})
	if err != nil {
		b.Fatal(err)
	}
	return rt, h, api
}
