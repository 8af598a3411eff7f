package envapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1/gauntletv1connect"
)

// Request body caps, per route, checked before a byte of the body is read: against the
// Content-Length when the client sends one, and on the wire (and, by connect, after
// decompression) while reading otherwise. A larger request is refused with
// RESOURCE_EXHAUSTED, which HTTP/JSON clients see as 413 (gRPC has no such status).
const (
	// stepBodyMax fits the largest legitimate Step in JSON, where it is largest: an
	// action whose arguments are at env.MaxArgsBytes and a policy version at
	// maxPolicyVersion, both up to six times their size when JSON escapes every byte as
	// \u00XX, and trainer data at play.MaxTrainerTokens token ids, each with a logprob
	// (at most 12 bytes a token id and 25 a logprob, as Python writes a float, with
	// their separators), plus 64 KiB for the rest of the message: about 9.7 MiB. A 12 MB
	// action is over it.
	stepBodyMax = 6*env.MaxArgsBytes + 6*maxPolicyVersion + play.MaxTrainerTokens*(12+25) + 64<<10
	// smallBodyMax bounds every other call but the batches (whose cap is
	// Config.MaxBatchBytes): ids, an env name, a seed, a profile name and env parameters
	// (a small JSON object).
	smallBodyMax = 1 << 20
)

// Which body cap a procedure has.
const (
	smallRoute = iota
	stepRoute
	batchRoute
)

func route(path string) int {
	switch path {
	case gauntletv1connect.EnvServiceStepProcedure:
		return stepRoute
	case gauntletv1connect.EnvServiceStepBatchProcedure, gauntletv1connect.EnvServiceSendProcedure,
		gauntletv1connect.EnvServiceStepStreamProcedure:
		return batchRoute
	}
	return smallRoute
}

// guard is the API's front door, an http.Handler in front of connect: it authenticates a
// request from its headers and checks its declared size before connect reads anything,
// so an unauthenticated or oversized body costs the server no memory and no waiting on
// a slow sender. It also backs off addresses that keep presenting bad tokens.
type guard struct {
	auth     auth
	log      *slog.Logger
	errw     *connect.ErrorWriter
	backoff  *backoff
	failures metric.Int64Counter
	// small, step and batch are the connect handlers with their decompressed caps;
	// batchMax is the batches' cap.
	small, step, batch http.Handler
	batchMax           int64
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, err := g.admit(r)
	if err != nil {
		g.refuse(w, r, err)
		return
	}
	h, limit := g.small, int64(smallBodyMax)
	switch route(r.URL.Path) {
	case stepRoute:
		h, limit = g.step, stepBodyMax
	case batchRoute:
		h, limit = g.batch, g.batchMax
	}
	if r.ContentLength > limit {
		g.refuse(w, r, tooLarge(r.ContentLength, limit))
		return
	}
	// One allocation carries what the request needs past the guard: its tenant, its
	// capped body and, for Connect unary calls, the 413 mapping.
	st := &guarded{ctx: tenantCtx{Context: r.Context(), t: t}, body: capped{rc: r.Body, left: limit, limit: limit}}
	r = r.WithContext(&st.ctx) // a copy: the server's own request keeps its body
	r.Body = &st.body
	if connectUnary(r) {
		st.w.ResponseWriter = w
		w = &st.w
	}
	h.ServeHTTP(w, r)
}

// admit authenticates r from its headers, before a byte of its body is read: an
// address backed off for failed tokens is refused whatever it sends, and a missing or
// unknown token counts toward its back-off. Both the connect API and the MCP endpoint
// admit requests through it, so they share tokens, back-off and the failure counter.
func (g *guard) admit(r *http.Request) (*Tenant, error) {
	if g.backoff.active() {
		if wait := g.backoff.refusing(remoteHost(r.RemoteAddr), time.Now()); wait > 0 {
			err := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("too many failed API tokens from this address; retry in %v", wait.Round(time.Second)))
			err.Meta().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
			return nil, err
		}
	}
	t, err := g.auth.tenant(r.Header)
	if err != nil {
		host := remoteHost(r.RemoteAddr)
		g.failures.Add(r.Context(), 1)
		if n, blocked := g.backoff.fail(host, time.Now()); blocked {
			g.log.Warn("envapi: refusing an address after failed API tokens", "addr", host, "failures", n, "for", g.backoff.block)
		}
		return nil, err
	}
	return t, nil
}

// guarded is the per-request state the guard hands to connect.
type guarded struct {
	ctx  tenantCtx
	body capped
	w    sizeStatus
}

// tenantCtx is a request's context with its tenant (tenantOf).
type tenantCtx struct {
	context.Context
	t *Tenant
}

func (c *tenantCtx) Value(key any) any {
	if _, ok := key.(tenantKey); ok {
		return c.t
	}
	return c.Context.Value(key)
}

// capped is http.MaxBytesReader without its allocation: a body that reads past limit
// fails with *http.MaxBytesError, which connect answers as RESOURCE_EXHAUSTED.
type capped struct {
	rc          io.ReadCloser
	left, limit int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, &http.MaxBytesError{Limit: c.limit}
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1] // one byte more than allowed tells an overflow from the end
	}
	n, err := c.rc.Read(p)
	if int64(n) <= c.left {
		c.left -= int64(n)
		return n, err
	}
	n, c.left = int(c.left), -1
	return n, &http.MaxBytesError{Limit: c.limit}
}

func (c *capped) Close() error { return c.rc.Close() }

// refuse answers err in the request's protocol without reading its body. The server
// then closes the connection (gracefully, so the client reads the answer) if more than
// 256 KiB of the body is unsent, else drains it to keep the connection; the short read
// deadline keeps a slow sender from holding that drain open.
func (g *guard) refuse(w http.ResponseWriter, r *http.Request, err error) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Second))
	if connectUnary(r) {
		w = &sizeStatus{ResponseWriter: w}
	}
	_ = g.errw.Write(w, r, err)
}

func tooLarge(n, limit int64) error {
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("request body of %d bytes is larger than this call's limit of %d", n, limit))
}

// connectUnary reports whether r is a Connect unary call (HTTP/JSON or binary over
// plain POST), whose errors travel as HTTP statuses.
func connectUnary(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return strings.HasPrefix(ct, "application/json") || strings.HasPrefix(ct, "application/proto")
}

// sizeStatus turns connect's 429 for RESOURCE_EXHAUSTED into 413 when it is a size
// refusal. Quota refusals always carry Retry-After (overQuota); size refusals, whether
// from the guard or from connect reading past a cap, never do.
type sizeStatus struct{ http.ResponseWriter }

func (s *sizeStatus) WriteHeader(code int) {
	if code == http.StatusTooManyRequests && s.Header().Get("Retry-After") == "" {
		code = http.StatusRequestEntityTooLarge
	}
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *sizeStatus) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func remoteHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// backoff counts failed API tokens per remote address: after limit failures within
// window, the address is refused for block, before its token is even looked at, so
// guessing tokens from one address runs at limit guesses per window. The table is
// bounded: past maxAddrs addresses the oldest entries are dropped.
type backoff struct {
	limit         int
	window, block time.Duration
	// n is the number of addresses in the table, so the common case (no failures)
	// costs an atomic load and no lock.
	n  atomic.Int64
	mu sync.Mutex
	by map[string]*failureCount
}

type failureCount struct {
	n            int
	first, until time.Time
}

const maxAddrs = 65536

func newBackoff(limit int, block time.Duration) *backoff {
	return &backoff{limit: limit, window: time.Minute, block: block, by: map[string]*failureCount{}}
}

func (b *backoff) active() bool { return b.limit > 0 && b.n.Load() > 0 }

// refusing returns how much longer host is refused, or 0.
func (b *backoff) refusing(host string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.by[host]
	if f == nil || !now.Before(f.until) {
		return 0
	}
	return f.until.Sub(now)
}

// fail records a failed token from host; it returns the failures counted and whether
// this one started a block.
func (b *backoff) fail(host string, now time.Time) (int, bool) {
	if b.limit <= 0 {
		return 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.by[host]
	if f == nil || now.Sub(f.first) > b.window && !now.Before(f.until) {
		if f == nil {
			b.prune(now)
		}
		f = &failureCount{first: now}
		b.by[host] = f
		b.n.Store(int64(len(b.by)))
	}
	f.n++
	if f.n >= b.limit && !now.Before(f.until) {
		f.until = now.Add(b.block)
		n := f.n
		f.n, f.first = 0, f.until // counting starts again when the block ends
		return n, true
	}
	return f.n, false
}

// prune drops entries whose window and block are over, and, if the table is still
// full, all of it but the blocked entries.
func (b *backoff) prune(now time.Time) {
	if len(b.by) < maxAddrs {
		return
	}
	for h, f := range b.by {
		if now.Sub(f.first) > b.window && !now.Before(f.until) {
			delete(b.by, h)
		}
	}
	if len(b.by) >= maxAddrs {
		for h, f := range b.by {
			if !now.Before(f.until) {
				delete(b.by, h)
			}
		}
	}
}

// limitListener caps the connections the server holds: at most total at once (Accept
// waits for one to close, as netutil.LimitListener does) and at most perHost from one
// remote address (more are closed at once, so one client cannot take every slot).
type limitListener struct {
	net.Listener
	slots   chan struct{}
	perHost int
	mu      sync.Mutex
	byHost  map[string]int
	done    chan struct{}
	once    sync.Once
}

func newLimitListener(ln net.Listener, total, perHost int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, total), perHost: perHost,
		byHost: map[string]int{}, done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		host := remoteHost(c.RemoteAddr().String())
		l.mu.Lock()
		over := l.byHost[host] >= l.perHost
		if !over {
			l.byHost[host]++
		}
		l.mu.Unlock()
		if over {
			_ = c.Close()
			<-l.slots
			continue
		}
		return &limitConn{Conn: c, l: l, host: host}, nil
	}
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (l *limitListener) release(host string) {
	l.mu.Lock()
	if l.byHost[host]--; l.byHost[host] <= 0 {
		delete(l.byHost, host)
	}
	l.mu.Unlock()
	<-l.slots
}

type limitConn struct {
	net.Conn
	l    *limitListener
	host string
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.host) })
	return err
}
