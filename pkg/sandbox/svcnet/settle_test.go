package svcnet_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/netns"
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
	stalledSteps(context.Background(), t, r, g, "after the connection went quiet: Settle returned at its bound, want settled at once", "while the host holds the connection", nil)
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
	closeWithin(t, g, "the relay the host holds")
}

// heldHostRig is a process sandbox whose plain TCP port hold reaches a host that accepts
// one connection and holds it, reading and writing nothing (held hands it to the test,
// which closes it when it wants), and the sandbox's gateway with Settle bounded at wait.
// The gateway is closed at cleanup (a second Close is harmless).
func heldHostRig(t *testing.T, hold sandbox.HostPort, wait time.Duration) (*egressRig, *svcnet.Gateway, <-chan net.Conn) {
	t.Helper()
	addr, held := heldHost(t)
	r, g, _ := hostRig(t, sandbox.HostMap{hold.Host + ":" + strconv.Itoa(hold.Port) + sandbox.TCPSuffix: addr},
		sandbox.Service{Hosts: []string{hold.Host}, TCPPorts: []sandbox.HostPort{hold}}, svcnet.Options{SettleWait: wait})
	return r, g, held
}

// heldHost is a TCP server that accepts one connection and holds it, reading and
// writing nothing, until the test takes it from held (and reads, writes or closes it
// when it wants); it returns its address.
func heldHost(t *testing.T) (string, <-chan net.Conn) {
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
	return l.Addr().String(), held
}

// hostRig is a process sandbox whose egress service is svc, its hosts reached where
// hosts maps them, and the sandbox's gateway opened with opt (its Settle bound, its
// decider), recording into the rig's recorder; it also returns the sandbox's network
// namespace, where a test dials as a process of the sandbox does (netns.Dial). The
// gateway is closed at cleanup (a second Close is harmless).
func hostRig(t *testing.T, hosts sandbox.HostMap, svc sandbox.Service, opt svcnet.Options) (*egressRig, *svcnet.Gateway, string) {
	t.Helper()
	dir := t.TempDir()
	rt, err := process.New(process.Config{StateDir: dir, Hosts: hosts})
	if err != nil {
		t.Fatalf("process runtime unavailable: %v", err)
	}
	t.Cleanup(func() { _ = rt.Purge(context.Background()); _ = rt.Close() })
	r := newEgressRig(t, rt, "", svc)
	opt.OnFire, opt.OnRequest = r.rec.OnFire, r.rec.OnRequest
	g, err := svcnet.Attach(context.Background(), r.rt, r.h.ID, r.h.Spec.Services, opt)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return r, g, filepath.Join(dir, "netns", r.h.ID)
}

// stallSize is what a streaming host sends on each connection: more than every socket's
// buffer between the host and a sandbox that reads nothing holds, so that the relay's
// writes toward the sandbox wait for it.
const stallSize = 16 << 20

// little is what the stalled side of a relay reads before it stops again: far less than
// stallSize.
const little = 64 << 10

// TestStalledReaderCostsStepsNothing: a plain TCP connection the sandbox opened and
// stopped reading (a background process's, or one left in a sleeping process), while its
// host sends more than the buffers between them hold, costs no step Settle's bound: the
// relay's write toward the sandbox waits for the sandbox, which nothing the gateway does
// can end, so every step's Settle returns settled, one in which the sandbox read a
// little too. When the sandbox reads again, what the relay then passes on is waited for
// as before: the connection, which the host ended behind its bytes, is recorded in the
// step the sandbox read them in.
func TestStalledReaderCostsStepsNothing(t *testing.T) {
	stream := sandbox.HostPort{Host: "stream.example.test", Port: 7000}
	r, g, ns := hostRig(t, sandbox.HostMap{stream.Host + ":" + strconv.Itoa(stream.Port) + sandbox.TCPSuffix: streamHost(t, stallSize)},
		sandbox.Service{Hosts: []string{stream.Host}, TCPPorts: []sandbox.HostPort{stream}}, svcnet.Options{SettleWait: time.Second})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stalledSteps(ctx, t, r, g, "while the sandbox reads nothing: Settle returned at its bound, want settled", "while the host streams", func() {
		// The sandbox reads a little, and stops again.
		if _, err := io.CopyN(io.Discard, c, little); err != nil {
			t.Fatal(err)
		}
	})
	// The sandbox reads all but the last bytes: what is left, and the host's end, fit
	// the buffers, and the relay passes them on while Settle waits.
	if _, err := io.CopyN(io.Discard, c, stallSize-little-16<<10); err != nil {
		t.Fatal(err)
	}
	if !g.Settle(ctx) {
		t.Errorf("the step the sandbox read in: Settle returned at its bound")
	}
	if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != stream.Host || got[0].Method != svcnet.MethodTCP || got[0].Bytes != stallSize {
		t.Errorf("after the sandbox read the stream: recorded %+v, want the connection with its %d bytes, in this step", got, stallSize)
	}
}

// TestStalledAnswerCostsStepsNothing: an HTTP request whose answer the sandbox stopped
// reading is being served until the sandbox reads it, but the gateway's handler waits for
// the sandbox there, and no step's Settle waits for it; when the sandbox closes the
// connection, the request is recorded in that step, its answer cut short.
func TestStalledAnswerCostsStepsNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, stallSize)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	r, g, ns := hostRig(t, sandbox.HostMap{remoteHost: l.Addr().String()}, sandbox.Service{Hosts: []string{remoteHost}}, svcnet.Options{SettleWait: time.Second})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: "+remoteHost+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	stalledSteps(ctx, t, r, g, "while the sandbox reads nothing: Settle returned at its bound, want settled", "while the answer waits", nil)
	_ = c.Close() // with bytes unread: the sandbox's kernel resets the connection
	r.sh(`true`)
	if !g.Settle(ctx) {
		t.Errorf("the step the sandbox closed in: Settle returned at its bound")
	}
	if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != remoteHost || got[0].Path != "/big" || got[0].Bytes >= stallSize {
		t.Errorf("after the sandbox closed: recorded %+v, want the request, cut short, in this step", got)
	}
}

// TestStalledHostCostsStepsNothing: the mirror of TestStalledReaderCostsStepsNothing. A
// relayed connection whose host stopped reading (an upload to a host that stalls, a
// peer that never reads), while the sandbox sends more than the buffers between them
// hold, costs no step Settle's bound: the relay's write toward the host waits for the
// host, which nothing the gateway does can end, so every step's Settle returns settled,
// one in which the host read a little too. When the host reads again, what the relay
// then passes on is waited for as before: the connection, which the sandbox ended
// behind its bytes and the host after reading them, is recorded in the step the host
// read them in. A plain TCP port's relay and a TLS port's (the sandbox's ClientHello,
// then bytes the gateway passes on unread) are the same relay.
func TestStalledHostCostsStepsNothing(t *testing.T) {
	for _, tc := range sinkRelays(t) {
		t.Run(tc.name, func(t *testing.T) {
			r, g, c, held := dialSinkRelay(t, tc)
			ctx := context.Background()
			sent := make(chan error, 1)
			go func() {
				// The sandbox sends stallSize bytes, then its end: the writes wait for the host.
				_, err := c.Write(append(tc.first, make([]byte, stallSize)...))
				if err == nil {
					err = c.(interface{ CloseWrite() error }).CloseWrite()
				}
				sent <- err
			}()
			hc := <-held
			defer hc.Close()
			total := int64(len(tc.first) + stallSize)
			stalledSteps(ctx, t, r, g, "while the host reads nothing: Settle returned at its bound, want settled", "while the sandbox sends", func() {
				// The host reads a little, and stops again.
				if _, err := io.CopyN(io.Discard, hc, little); err != nil {
					t.Fatal(err)
				}
			})
			// The host reads all but the last bytes, the sandbox's writes and end are
			// done, and the host reads on to that end and ends its side while Settle
			// waits: the relay passes on what is left, the sandbox's end and the host's.
			if _, err := io.CopyN(io.Discard, hc, total-little-16<<10); err != nil {
				t.Fatal(err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			go func() {
				_, _ = io.Copy(io.Discard, hc)
				_ = hc.Close()
			}()
			if !g.Settle(ctx) {
				t.Errorf("the step the host read in: Settle returned at its bound")
			}
			if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != sinkHost || got[0].Method != tc.method || got[0].BytesUp != total {
				t.Errorf("after the host read the upload: recorded %+v, want the connection with its %d bytes up, in this step", got, total)
			}
		})
	}
}

// sinkRelay is one kind of relay to sinkHost: a plain TCP port's or a TLS port's (the
// sandbox's ClientHello, then bytes the gateway passes on unread).
type sinkRelay struct {
	name   string
	port   int
	svc    sandbox.Service
	key    string // the host map's key of sinkHost's port
	method string
	first  []byte // what the sandbox sends before its upload
}

// sinkRelays are the two kinds of relay to sinkHost.
func sinkRelays(t *testing.T) []sinkRelay {
	return []sinkRelay{
		{"tcp", 7000, sandbox.Service{Hosts: []string{sinkHost}, TCPPorts: []sandbox.HostPort{{Host: sinkHost, Port: 7000}}}, sinkHost + ":7000" + sandbox.TCPSuffix, svcnet.MethodTCP, nil},
		{"tls", 443, sandbox.Service{Hosts: []string{sinkHost}, TLSPorts: []int{443}}, sinkHost + ":443", svcnet.MethodTLS, clientHello(t, sinkHost)},
	}
}

// dialSinkRelay opens a sandbox's gateway (a one-second Settle bound) whose sinkHost is
// a host holding what it accepts and reading nothing (heldHost), and dials tc's port
// from the sandbox; the connection is closed when the test ends.
func dialSinkRelay(t *testing.T, tc sinkRelay) (*egressRig, *svcnet.Gateway, net.Conn, <-chan net.Conn) {
	t.Helper()
	addr, held := heldHost(t)
	r, g, ns := hostRig(t, sandbox.HostMap{tc.key: addr}, tc.svc, svcnet.Options{SettleWait: time.Second})
	c, err := netns.Dial(context.Background(), ns, "tcp", "127.0.0.1:"+strconv.Itoa(tc.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return r, g, c, held
}

// clientHello is the ClientHello record a TLS client asking for host opens with.
func clientHello(t *testing.T, host string) []byte {
	t.Helper()
	cc, sc := net.Pipe()
	defer sc.Close() // the handshake, waiting for an answer, fails
	go func() {
		_ = tls.Client(cc, &tls.Config{ServerName: host}).Handshake()
		_ = cc.Close()
	}()
	rec := make([]byte, 5) // a record's header: type, version, length
	if _, err := io.ReadFull(sc, rec); err != nil {
		t.Fatal(err)
	}
	rec = append(rec, make([]byte, binary.BigEndian.Uint16(rec[3:]))...)
	if _, err := io.ReadFull(sc, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestStalledUploadCostsStepsNothing: an HTTP request whose body its host stopped
// reading (an upload to a host that stalls) is being served until the host reads it,
// but the gateway's handler waits for the host there, and no step's Settle waits for
// it; when the host reads the body and answers, the request is recorded in that step.
func TestStalledUploadCostsStepsNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{}) // closed: the host reads the body
	var release sync.Once
	body := make(chan int64, 1) // the body's bytes the host read
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		<-read
		n, _ := io.Copy(io.Discard, req.Body)
		body <- n
		_, _ = io.WriteString(w, "stored\n")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	t.Cleanup(func() { release.Do(func() { close(read) }) }) // first: a failed test's handler ends
	r, g, ns := hostRig(t, sandbox.HostMap{remoteHost: l.Addr().String()}, sandbox.Service{Hosts: []string{remoteHost}}, svcnet.Options{SettleWait: time.Second})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: "+remoteHost+"\r\nContent-Length: "+strconv.Itoa(stallSize)+"\r\n\r\n")
		if err == nil {
			_, err = c.Write(make([]byte, stallSize))
		}
		sent <- err
	}()
	stalledSteps(ctx, t, r, g, "while the host reads nothing: Settle returned at its bound, want settled", "while the upload waits", nil)
	release.Do(func() { close(read) })
	if n := <-body; n != stallSize {
		t.Fatalf("the host read %d bytes of the body, want %d", n, stallSize)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	r.sh(`true`)
	if !g.Settle(ctx) {
		t.Errorf("the step the host read in: Settle returned at its bound")
	}
	if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != remoteHost || got[0].Method != http.MethodPost || got[0].Path != "/upload" || got[0].Status != http.StatusOK {
		t.Errorf("after the host read the upload: recorded %+v, want the request, answered, in this step", got)
	}
}

// TestResetEndsAStalledUpload: a sandbox that resets its connection while its
// request's body waits for the host to read does not leave the request open until the
// host reads or goes away: at the next step the gateway drops the connection to the
// host, and the request is recorded, failed.
func TestResetEndsAStalledUpload(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})       // closed at cleanup: the handler ends
	arrived := make(chan struct{}, 1) // the request's head reached the host
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived <- struct{}{}
		<-read
		_, _ = io.Copy(io.Discard, req.Body)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	t.Cleanup(func() { close(read) })
	r, g, ns := hostRig(t, sandbox.HostMap{remoteHost: l.Addr().String()}, sandbox.Service{Hosts: []string{remoteHost}}, svcnet.Options{SettleWait: time.Second})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started := make(chan struct{})
	go func() {
		defer close(started)
		_, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: "+remoteHost+"\r\nContent-Length: "+strconv.Itoa(stallSize)+"\r\n\r\n")
		if err == nil {
			_, _ = c.Write(make([]byte, stallSize)) // fails at the reset
		}
	}()
	<-arrived
	stalledSteps(ctx, t, r, g, "while the host reads nothing: Settle returned at its bound, want settled", "while the upload waits", nil)
	if err := c.(interface{ SetLinger(int) error }).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	<-started
	var got []svcnet.Request
	for step := 0; step < 3 && len(got) == 0; step++ {
		r.sh(`true`)
		g.Settle(ctx)
		got = r.rec.TakeRequests()
	}
	if len(got) != 1 || got[0].Host != remoteHost || got[0].Method != http.MethodPost || got[0].Path != "/upload" || got[0].Status == http.StatusOK {
		t.Errorf("three steps after the sandbox's reset: recorded %+v, want the request, failed", got)
	}
}

// TestSettleWaitsForTheGatewaysPace: a relay the gateway paces on purpose (a bandwidth
// cap) is the gateway's own work, not a sandbox's stalled read: a sandbox that reads
// the first byte only, while its host's few bytes and end are passed on at the cap's pace, still
// finds the connection recorded in the step, Settle waiting for the pace.
func TestSettleWaitsForTheGatewaysPace(t *testing.T) {
	thin := sandbox.HostPort{Host: "thin.example.test", Port: 7000}
	const profile = `name: pace
faults:
  - {id: thin, kind: bandwidth, match: {hosts: [thin.example.test]}, params: {bytes_per_sec: 20000}}
`
	const size = 10000 // half a second at the cap; the buffers hold it all
	// An hour's bound: a Settle that stopped waiting for the pace would return at once.
	r, g, ns := hostRig(t, sandbox.HostMap{thin.Host + ":" + strconv.Itoa(thin.Port) + sandbox.TCPSuffix: streamHost(t, size)},
		sandbox.Service{Hosts: []string{thin.Host}, TCPPorts: []sandbox.HostPort{thin}}, svcnet.Options{SettleWait: time.Hour, Decider: inject.NewDecider(1, rulesOf(t, profile))})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// As a command reading the host's answer does, wait for its first byte: from then
	// on the relay's pace is all there is to wait for (the host sent everything and
	// ended). Before it, the gateway cannot know that the host will speak at all.
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if !g.Settle(ctx) {
		t.Fatal("Settle returned at its bound")
	}
	if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != thin.Host || got[0].Bytes != size || !slices.Equal(got[0].Faults, []string{"bandwidth"}) {
		t.Errorf("after Settle: recorded %+v, want the connection with its %d bytes, paced, in this step", got, size)
	}
}

// TestCloseEndsAStalledRelay: a relay whose write waits for a sandbox that stopped
// reading, its host streaming on, does not keep the gateway's Close waiting.
func TestCloseEndsAStalledRelay(t *testing.T) {
	stream := sandbox.HostPort{Host: "stream.example.test", Port: 7000}
	_, g, ns := hostRig(t, sandbox.HostMap{stream.Host + ":" + strconv.Itoa(stream.Port) + sandbox.TCPSuffix: streamHost(t, math.MaxInt64)},
		sandbox.Service{Hosts: []string{stream.Host}, TCPPorts: []sandbox.HostPort{stream}}, svcnet.Options{SettleWait: time.Second})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g.Settle(ctx) // the relay is under way
	closeWithin(t, g, "the relay the sandbox stopped reading")
}

// TestCloseEndsARelayItsHostStalls: a relay whose write waits for a host that stopped
// reading, its sandbox sending on, does not keep the gateway's Close waiting.
func TestCloseEndsARelayItsHostStalls(t *testing.T) {
	_, g, c, held := dialSinkRelay(t, sinkRelays(t)[0])
	ctx := context.Background()
	go func() { _, _ = c.Write(make([]byte, stallSize)) }() // ends when the test closes c
	hc := <-held
	defer hc.Close()
	g.Settle(ctx) // the relay is under way
	closeWithin(t, g, "the relay whose host stopped reading")
}

// TestResetEndsARelayItsHostStalls: a sandbox that resets its connection while the
// relay's write toward the host waits for the host to read does not leave the relay
// open until the host reads or goes away: at the next step the gateway drops the
// host's side, the relay ends and is recorded, with what went up before the reset.
func TestResetEndsARelayItsHostStalls(t *testing.T) {
	for _, tc := range sinkRelays(t) {
		t.Run(tc.name, func(t *testing.T) {
			r, g, c, held := dialSinkRelay(t, tc)
			ctx := context.Background()
			go func() { _, _ = c.Write(append(tc.first, make([]byte, stallSize)...)) }() // fails at the reset
			hc := <-held
			defer hc.Close()
			// The host reads a little (the relay is under way), then nothing.
			if _, err := io.CopyN(io.Discard, hc, little); err != nil {
				t.Fatal(err)
			}
			stalledSteps(ctx, t, r, g, "while the host reads nothing: Settle returned at its bound, want settled", "while the sandbox sends", nil)
			// The sandbox resets its connection (a close with linger 0, as a killed
			// process's socket with unread input is).
			if err := c.(interface{ SetLinger(int) error }).SetLinger(0); err != nil {
				t.Fatal(err)
			}
			_ = c.Close()
			var got []svcnet.Request
			for step := 0; step < 3 && len(got) == 0; step++ {
				r.sh(`true`)
				g.Settle(ctx)
				got = r.rec.TakeRequests()
			}
			if len(got) != 1 || got[0].Host != sinkHost || got[0].BytesUp < little {
				t.Fatalf("three steps after the sandbox's reset: recorded %+v, want the relay, ended, with the %d bytes and more it sent up", got, little)
			}
			// The host's side is closed: what the host reads ends, after the bytes
			// the relay had passed on (a hang guard, not a speed target).
			_ = hc.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, hc); err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("the host's connection is still open after the relay was recorded: %v", err)
			}
		})
	}
}

// closeWithin closes g and fails the test if Close still waits after 30 s for what
// (a hang guard, not a speed target: Close ends at once).
func closeWithin(t *testing.T, g *svcnet.Gateway, what string) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waits for " + what)
	}
}

// streamHost is a TCP server that sends n bytes on every connection it takes, then
// closes it; it returns its address. What it still sends when the test ends is cut.
func streamHost(t testing.TB, n int64) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		chunk := make([]byte, 64<<10)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for left := n; left > 0; {
					k, err := c.Write(chunk[:min(left, int64(len(chunk)))])
					if err != nil {
						return
					}
					left -= int64(k)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// TestSettleWaitsForTheDial: a connection the sandbox opened to an allowed host is work
// under way while the gateway dials the host, even though neither side has sent a byte
// yet: the dial is the gateway's to finish. Here the host's accept queue is full, so the
// dial takes its whole timeout and fails; Settle waits for that, and the connection is
// recorded in this step, as unreachable.
func TestSettleWaitsForTheDial(t *testing.T) {
	slow := sandbox.HostPort{Host: "slow.example.test", Port: 7000}
	r, g, ns := hostRig(t, sandbox.HostMap{slow.Host + ":" + strconv.Itoa(slow.Port) + sandbox.TCPSuffix: fullBacklog(t)},
		sandbox.Service{Hosts: []string{slow.Host}, TCPPorts: []sandbox.HostPort{slow}},
		svcnet.Options{SettleWait: time.Hour, DialTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	c, err := netns.Dial(ctx, ns, "tcp", "127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !g.Settle(ctx) {
		t.Fatal("Settle returned at its bound")
	}
	if got := r.rec.TakeRequests(); len(got) != 1 || got[0].Host != slow.Host || got[0].Error != "upstream unreachable" {
		t.Errorf("after Settle: recorded %+v, want the connection, unreachable, in this step", got)
	}
}

// fullBacklog is the address of a TCP listener that never accepts, its accept queue
// (backlog 0) filled: a connection to it waits for a SYN retransmission, a second at
// least, and a dial with a shorter timeout fails.
func fullBacklog(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
	// Fill the queue: a backlog of 0 holds one connection; the dial that times out is
	// the first the queue has no room for.
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	return addr
}

// stalledSteps plays three steps while a connection waits on a side that stopped
// reading (or on a host holding it quiet): each must settle at once and record nothing
// yet. settling and recording say what the steps are in the errors; midway, when not
// nil, runs in the second step before its Settle (the stalled side reads a little and
// stops again).
func stalledSteps(ctx context.Context, t *testing.T, r *egressRig, g *svcnet.Gateway, settling, recording string, midway func()) {
	t.Helper()
	for step := range 3 {
		r.sh(`true`)
		if step == 1 && midway != nil {
			midway()
		}
		if !g.Settle(ctx) {
			t.Errorf("step %d "+settling, step+1)
		}
		if got := r.rec.TakeRequests(); len(got) != 0 {
			t.Errorf("step %d %s: recorded %+v, want nothing yet", step+1, recording, got)
		}
	}
}
