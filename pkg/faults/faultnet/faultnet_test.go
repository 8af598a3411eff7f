package faultnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultnet"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

func decider(t *testing.T, spec string) *inject.Decider {
	t.Helper()
	_, rules, err := plans.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	return inject.NewDecider(42, rules)
}

// upstream is a real loopback HTTP service, like one a sandboxed agent may call.
func upstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-1")
		_, _ = io.WriteString(w, `{"items":[`+strings.Repeat(`{"sku":"sku-00001","qty":1},`, 60)+`{"sku":"last"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

type recorder struct {
	mu    sync.Mutex
	kinds []string
}

func (r *recorder) fire(_ string, _ catalogue.Event, fired []catalogue.Fired) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range fired {
		r.kinds = append(r.kinds, f.Kind)
	}
}

func (r *recorder) saw(kind string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// proxied starts the proxy in front of a real upstream and returns a client whose
// requests go to the proxy (reverse-proxy mode), plus the proxy's base URL.
func proxied(t *testing.T, spec string) (*http.Client, string, *recorder) {
	t.Helper()
	up := upstream(t)
	u, _ := url.Parse(up.URL)
	rec := &recorder{}
	p := &faultnet.Proxy{D: decider(t, spec), OnFire: rec.fire, Default: u, Services: map[string]string{"127.0.0.1": "shop"}}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	return &http.Client{Timeout: 5 * time.Second}, front.URL, rec
}

const header = "name: test\nfaults:\n"

func TestProxy429ReachesClientWithRetryAfter(t *testing.T) {
	c, base, rec := proxied(t, header+`
  - id: rate-limit
    kind: http_error
    probability: 1
    match: {paths: ["/v1/*"], methods: [POST]}
    params: {status: 429, retry_after_ms: 2500}
`)
	resp, err := c.Post(base+"/v1/orders", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("status %d Retry-After %q, want 429 and 3 (2.5 s rounded up)", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if !rec.saw(catalogue.KindHTTPError) {
		t.Fatal("the fired 429 was not reported")
	}
	// The match is by path and method: a GET, or another path, passes.
	for _, req := range []struct{ method, path string }{{"GET", "/v1/orders"}, {"POST", "/v2/orders"}} {
		r, _ := http.NewRequest(req.method, base+req.path, strings.NewReader(`{}`))
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: status %d, want 200", req.method, req.path, resp.StatusCode)
		}
	}
}

func TestProxyResetReachesClient(t *testing.T) {
	c, base, _ := proxied(t, header+"  - {id: rst, kind: reset, params: {after_bytes: 0}}\n")
	_, err := c.Get(base + "/v1/items")
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("error %v is not a connection reset", err)
	}
	// A reset part-way through the response: the client gets a broken response.
	c, base, _ = proxied(t, header+"  - {id: rst, kind: reset, params: {after_bytes: 60}}\n")
	if _, err = c.Get(base + "/v1/items"); err == nil {
		t.Fatal("a request reset after 60 bytes of response succeeded")
	}
}

func TestProxyBodyRewrites(t *testing.T) {
	t.Run("truncate", func(t *testing.T) {
		c, base, _ := proxied(t, header+"  - {id: cut, kind: truncate, params: {keep_fraction: 0.3}}\n")
		resp, err := c.Get(base + "/x")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if !errors.Is(err, io.ErrUnexpectedEOF) || len(b) == 0 || int64(len(b)) >= resp.ContentLength {
			t.Fatalf("read %d of %d bytes, err %v: want a cut body and unexpected EOF", len(b), resp.ContentLength, err)
		}
	})
	t.Run("broken gzip", func(t *testing.T) {
		c, base, _ := proxied(t, header+"  - {id: gz, kind: broken_gzip}\n")
		resp, err := c.Get(base + "/x") // the client asks for gzip and decodes it itself
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err == nil {
			t.Fatal("a broken gzip body decoded without error")
		}
	})
	t.Run("headers", func(t *testing.T) {
		c, base, _ := proxied(t, header+`
  - {id: h1, kind: header_missing, params: {header: X-Request-Id}}
  - {id: h2, kind: header_garbled, params: {header: Content-Type}}
`)
		resp, err := c.Get(base + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("X-Request-Id") != "" {
			t.Fatal("X-Request-Id survived header_missing")
		}
		if ct := resp.Header.Get("Content-Type"); ct == "" {
			t.Fatal("Content-Type missing, want garbled")
		} else if _, _, err := mime.ParseMediaType(ct); err == nil {
			t.Fatalf("Content-Type %q still parses", ct)
		}
	})
	t.Run("slow body", func(t *testing.T) {
		c, base, _ := proxied(t, header+"  - {id: slow, kind: slow_body, params: {bytes_per_sec: 8000}}\n")
		start := time.Now()
		resp, err := c.Get(base + "/x")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		// ~1.7 kB at 8 kB/s: at least 150 ms, paced in 50 ms chunks.
		if min := time.Duration(float64(len(b)-400) / 8000 * float64(time.Second)); time.Since(start) < min {
			t.Fatalf("%d bytes in %v: faster than the cap allows (%v)", len(b), time.Since(start), min)
		}
	})
}

func TestProxyLatencyAndTimeout(t *testing.T) {
	c, base, _ := proxied(t, header+"  - {id: slow, kind: latency, params: {mean_ms: 120}}\n")
	start := time.Now()
	resp, err := c.Get(base + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(start); d < 120*time.Millisecond {
		t.Fatalf("answered in %v, want >= 120 ms", d)
	}
	// The fault holds the request far longer than the test waits: only the client's own
	// timeout can end it, which the error's kind says (no wall-clock bound needed).
	c, base, _ = proxied(t, header+"  - {id: hang, kind: timeout, params: {hold_ms: 600000}}\n")
	c.Timeout = 200 * time.Millisecond
	_, err = c.Get(base + "/x")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want a client timeout", err)
	}
}

func TestResolverFailures(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind  string
		check func(*net.DNSError) bool
	}{
		{"dns_nxdomain", func(e *net.DNSError) bool { return e.IsNotFound }},
		{"dns_servfail", func(e *net.DNSError) bool { return e.IsTemporary && !e.IsNotFound }},
		{"dns_timeout", func(e *net.DNSError) bool { return e.IsTimeout }},
	} {
		params := ""
		if tc.kind == "dns_timeout" {
			params = ", params: {after_ms: 10}"
		}
		r := &faultnet.Resolver{D: decider(t, header+"  - {id: d, kind: "+tc.kind+", match: {hosts: [\"*.internal\"]}"+params+"}\n"),
			Lookup: func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }}
		_, err := r.LookupHost(ctx, "pay.internal")
		var de *net.DNSError
		if !errors.As(err, &de) || !tc.check(de) {
			t.Errorf("%s: err = %#v", tc.kind, err)
		}
		if addrs, err := r.LookupHost(ctx, "example.org"); err != nil || addrs[0] != "127.0.0.1" {
			t.Errorf("%s: an unmatched host failed: %v", tc.kind, err)
		}
	}
	// Through the proxy, the upstream lookup fails and the client sees 502 naming it.
	rec := &recorder{}
	p := &faultnet.Proxy{D: decider(t, header+"  - {id: d, kind: dns_nxdomain, match: {ops: [lookup]}}\n"), OnFire: rec.fire,
		Default: &url.URL{Scheme: "http", Host: "payments.invalid:80"}}
	front := httptest.NewServer(p)
	defer front.Close()
	resp, err := http.Get(front.URL + "/pay")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !bytes.Contains(b, []byte("no such host")) || !rec.saw(catalogue.KindDNSNXDomain) {
		t.Fatalf("status %d body %q", resp.StatusCode, b)
	}
}

// echoServer accepts through a fault Listener and echoes.
func echoServer(t *testing.T, spec string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &faultnet.Listener{Listener: ln, D: decider(t, spec)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := fl.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func TestConnResetAfterBytesReachesPeer(t *testing.T) {
	addr := echoServer(t, header+"  - {id: rst, kind: reset, params: {after_bytes: 1000}}\n")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	var got int
	var rerr error
	for i := 0; i < 40 && rerr == nil; i++ {
		if _, err := c.Write(bytes.Repeat([]byte("x"), 256)); err != nil {
			rerr = err
			break
		}
		var n int
		n, rerr = io.ReadFull(c, buf)
		got += n
	}
	if !errors.Is(rerr, syscall.ECONNRESET) && !errors.Is(rerr, syscall.EPIPE) {
		t.Fatalf("after %d echoed bytes err = %v, want ECONNRESET", got, rerr)
	}
	if got > 1000 {
		t.Fatalf("%d bytes echoed, the reset was due after 1000 through the server", got)
	}
}

func TestConnLatencyAndBandwidth(t *testing.T) {
	addr := echoServer(t, header+`
  - {id: lat, kind: latency, params: {mean_ms: 30}}
  - {id: bw, kind: bandwidth, params: {bytes_per_sec: 20000}}
`)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	msg := bytes.Repeat([]byte("y"), 4000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	// 4000 bytes read and written at 20 kB/s by the server, plus 30 ms latency.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("echo took %v, want >= 200 ms under the caps", d)
	}
}

// TestStreamDecidesOnce: a connection wrapped by WrapConn meets a latency rule when it
// opens and again on every write; one wrapped by WrapStream only when it opens, so how
// its bytes are cut into writes changes nothing of what it meets.
func TestStreamDecidesOnce(t *testing.T) {
	const spec = header + `
  - {id: lat, kind: latency, params: {mean_ms: 20}}
`
	for _, c := range []struct {
		name string
		wrap func(net.Conn, *inject.Decider, string, catalogue.Event, faultnet.OnFire) *faultnet.Conn
		want int
	}{{"conn", faultnet.WrapConn, 4}, {"stream", faultnet.WrapStream, 1}} {
		a, b := net.Pipe()
		fired := 0
		w := c.wrap(a, decider(t, spec), "k", catalogue.Event{Service: "s"}, func(_ string, _ catalogue.Event, f []catalogue.Fired) { fired += len(f) })
		go func() { _, _ = io.Copy(io.Discard, b) }()
		start := time.Now()
		for range 3 {
			if _, err := w.Write([]byte("abc")); err != nil {
				t.Fatal(err)
			}
		}
		took := time.Since(start)
		_ = w.Close()
		if fired != c.want || took < time.Duration(c.want)*20*time.Millisecond {
			t.Errorf("%s: %d faults in %v, want %d, each paid", c.name, fired, took, c.want)
		}
		if got := w.Written(); got != 9 {
			t.Errorf("%s: Written() = %d, want 9", c.name, got)
		}
	}
}

// peekConn is a connection whose Write calls peek first, as the peer could read the
// bytes (and close) before the writer's Write returns.
type peekConn struct {
	net.Conn
	peek func()
}

func (c peekConn) Write(b []byte) (int, error) {
	c.peek()
	return c.Conn.Write(b)
}

// Written counts bytes before they leave: a peer that has read them and closed may be
// seen (its EOF read on another goroutine) before the writer's Write returns, and the
// egress gateway records a connection's bytes at that EOF. Counted after the Write, a
// TLS relay's record once missed the tail of an answer its client had read whole
// (1,053 bytes recorded of a 2,000-byte body, in CI).
func TestWrittenCountsBytesBeforeTheyLeave(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go func() { _, _ = io.Copy(io.Discard, b) }()
	var w *faultnet.Conn
	var seen []int64
	w = faultnet.WrapStream(peekConn{Conn: a, peek: func() { seen = append(seen, w.Written()) }},
		decider(t, "name: none\nfaults: []\n"), "k", catalogue.Event{Service: "s"}, nil)
	defer w.Close()
	for _, s := range []string{"abc", "defgh"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if want := []int64{3, 8}; !slices.Equal(seen, want) {
		t.Fatalf("Written() while each Write was under way: %v, want %v (the bytes being written counted)", seen, want)
	}
	if got := w.Written(); got != 8 {
		t.Fatalf("Written() = %d, want 8", got)
	}
}

// A black-holed connection passes nothing on, its peer's end included: a client that
// sends its request, closes its side and waits for the answer (busybox nc, a database
// client's shutdown) must meet the hold, not see the relay end at once because the
// hole delivered its EOF. Before, Read returned that EOF, and a relayed plain TCP
// connection under a timeout ended in 86 ms instead of its hold's second.
func TestBlackHoleSwallowsThePeersEnd(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	w := faultnet.WrapStream(a, decider(t, header+"  - {id: hole, kind: timeout, params: {hold_ms: 300}}\n"), "k", catalogue.Event{Service: "s"}, nil)
	defer w.Close()
	go func() {
		_, _ = b.Write([]byte("request"))
		_ = b.Close() // the peer's end (net.Pipe has no half-close)
	}()
	start := time.Now()
	n, err := w.Read(make([]byte, 64))
	if took := time.Since(start); n != 0 || took < 250*time.Millisecond {
		t.Fatalf("Read = %d, %v after %v, want nothing until the hold ends (300ms)", n, err, took)
	}
	if err == io.EOF {
		t.Fatalf("Read ended with io.EOF: the hole passed the peer's end on")
	}
}

// OnAbort runs before a fault's reset or hold-end reaches the peer, with the bytes the
// connection carried final: the egress gateway records a connection there, so that a
// sandbox that meets the reset and ends its command at once finds it recorded.
func TestOnAbortRunsBeforeThePeerSeesTheEnd(t *testing.T) {
	for _, tc := range []struct{ name, rule string }{
		{"reset", "  - {id: rst, kind: reset, params: {after_bytes: 5}}\n"},
		{"hold", "  - {id: hole, kind: timeout, params: {hold_ms: 50}}\n"},
	} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peer, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.Accept()
		_ = l.Close()
		if err != nil {
			t.Fatal(err)
		}
		w := faultnet.WrapStream(c, decider(t, header+tc.rule), "k", catalogue.Event{Service: "s"}, nil)
		var mu sync.Mutex
		aborted, written := 0, int64(-1)
		w.OnAbort(func() {
			mu.Lock()
			defer mu.Unlock()
			aborted++
			written = w.Written()
		})
		go func() { _, _ = w.Write([]byte("0123456789")) }()
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _ := io.ReadAll(peer)
		mu.Lock()
		// (A reset may drop bytes the peer had not read yet: it sees at most those.)
		if aborted != 1 || written < int64(len(n)) {
			t.Errorf("%s: the peer saw the end after %d bytes; OnAbort had run %d times, with %d bytes written: want once, with them all", tc.name, len(n), aborted, written)
		}
		mu.Unlock()
		_ = w.Close()
		_ = peer.Close()
	}
}

// TestStreamLosesSegmentsWhateverTheWrites: a stream's packet loss is drawn per
// segment of its bytes, in each direction, so the same bytes lose the same segments
// whether they pass in one write or in many small ones, every byte arrives, and a
// stream the rule does not select draws nothing.
func TestStreamLosesSegmentsWhateverTheWrites(t *testing.T) {
	const spec = header + `
  - {id: loss, kind: packet_loss, match: {hosts: [lossy]}, params: {rate: 0.3, rto_ms: 0}}
`
	const n = 40 * faultnet.SegmentBytes
	body := bytes.Repeat([]byte("x"), n)
	play := func(host string, chunk int) []string {
		a, b := net.Pipe()
		var lost []string
		var mu sync.Mutex
		w := faultnet.WrapStream(a, decider(t, spec), "tcp/s/0", catalogue.Event{Service: "s", Host: host}, func(_ string, _ catalogue.Event, f []catalogue.Fired) {
			mu.Lock()
			defer mu.Unlock()
			for _, x := range f {
				lost = append(lost, x.Detail)
			}
		})
		got := make(chan int)
		go func() {
			m, _ := io.Copy(io.Discard, b)
			got <- int(m)
		}()
		for off := 0; off < n; off += chunk {
			if _, err := w.Write(body[off:min(off+chunk, n)]); err != nil {
				t.Fatal(err)
			}
		}
		// And the other way: the peer sends, the stream reads in small pieces.
		go func() { _, _ = b.Write(body[:3*faultnet.SegmentBytes]); _ = b.Close() }()
		buf := make([]byte, 100)
		for {
			if _, err := w.Read(buf); err != nil {
				break
			}
		}
		_ = w.Close()
		if m := <-got; m != n {
			t.Errorf("chunk %d: %d bytes arrived, want %d", chunk, m, n)
		}
		mu.Lock()
		defer mu.Unlock()
		return lost
	}
	whole := play("lossy", n)
	if len(whole) < 4 || len(whole) > 30 {
		t.Fatalf("lost %d of 43 segments at 30 %%: %q", len(whole), whole)
	}
	for _, chunk := range []int{1000, 1, 4096} {
		if got := play("lossy", chunk); !slices.Equal(got, whole) {
			t.Errorf("writes of %d: lost %q, want %q", chunk, got, whole)
		}
	}
	if got := play("other", n); len(got) != 0 {
		t.Errorf("a host the rule does not select lost %q", got)
	}
}
