package faultnet

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// maxBody bounds the upstream body the proxy buffers to rewrite it.
const maxBody = 64 << 20

// Proxy is an HTTP proxy between a sandbox and the services it may reach, applying the
// decider's service and network faults to each request (an OpRequest event of layer
// service, keyed "http/<host>"). It serves both forward-proxy requests (absolute URLs, as
// sent by clients configured with HTTP_PROXY) and reverse-proxy requests routed by Host.
//
// Composition follows the catalogue: an abort (HTTP error with Retry-After, reset,
// timeout) replaces the call; latency and a lost request (one RTO) delay it; rewrites
// (truncated body, missing or garbled header, broken gzip, slow body, bandwidth cap)
// change a response that did come back.
type Proxy struct {
	D      *inject.Decider
	OnFire OnFire
	// Upstreams routes reverse-proxy requests by Host (with or without port).
	Upstreams map[string]*url.URL
	// Default receives reverse-proxy requests no upstream matches (nil: 502).
	Default *url.URL
	// Services maps a host to the service name events carry.
	Services map[string]string
	// Transport reaches the upstreams (nil: one that resolves through a Resolver over D,
	// so DNS faults reach the upstream lookups).
	Transport http.RoundTripper
}

// hopHeaders are connection-scoped and never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (p *Proxy) transport() http.RoundTripper {
	if p.Transport == nil {
		d := &Dialer{Resolver: &Resolver{D: p.D, OnFire: p.OnFire}}
		p.Transport = &http.Transport{DialContext: d.DialContext, DisableCompression: true, MaxIdleConnsPerHost: 16}
	}
	return p.Transport
}

func (p *Proxy) target(r *http.Request) (*url.URL, string) {
	if r.URL.IsAbs() {
		u := *r.URL
		return &u, u.Hostname()
	}
	host := r.Host
	if u, ok := p.Upstreams[host]; ok {
		return withPath(u, r.URL), stripPort(host)
	}
	if u, ok := p.Upstreams[stripPort(host)]; ok {
		return withPath(u, r.URL), stripPort(host)
	}
	if p.Default != nil {
		return withPath(p.Default, r.URL), stripPort(host)
	}
	return nil, stripPort(host)
}

func withPath(base, req *url.URL) *url.URL {
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + req.Path
	u.RawQuery = req.RawQuery
	return &u
}

func stripPort(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	target, host := p.target(r)
	ev := catalogue.Event{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Host: host, Path: r.URL.Path, Method: r.Method, Service: p.Services[host]}
	key := "http/" + host
	dec := p.D.Decide(key, ev)
	if p.OnFire != nil && len(dec.Fired) > 0 {
		p.OnFire(key, ev, dec.Fired)
	}
	wait := dec.Delay
	if dec.Abort == catalogue.KindPacketLoss {
		wait += dec.RTO // the request was lost once and retransmitted
	}
	if !sleepCtx(r.Context(), wait) {
		return
	}
	switch dec.Abort {
	case catalogue.KindHTTPError:
		if dec.RetryAfter > 0 {
			secs := int64((dec.RetryAfter + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(dec.Status)
		fmt.Fprintf(w, "{\"error\":%q,\"status\":%d}\n", http.StatusText(dec.Status), dec.Status)
		return
	case catalogue.KindTimeout:
		sleepCtx(r.Context(), dec.Hold)
		hijackClose(w, nil, false)
		return
	}
	if target == nil {
		http.Error(w, "gauntlet proxy: no upstream for host "+r.Host, http.StatusBadGateway)
		return
	}
	out := r.Clone(r.Context())
	out.URL, out.Host, out.RequestURI = target, target.Host, ""
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	resp, err := p.transport().RoundTrip(out)
	if err != nil {
		if dec.Abort == catalogue.KindReset {
			hijackClose(w, nil, true)
			return
		}
		http.Error(w, "gauntlet proxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		http.Error(w, "gauntlet proxy: read upstream body: "+err.Error(), http.StatusBadGateway)
		return
	}
	if dec.Abort == catalogue.KindReset {
		// Send the first after_bytes of the response as the wire would carry it, then RST.
		var raw bytes.Buffer
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.TransferEncoding = nil
		_ = resp.Write(&raw)
		n := min(int64(raw.Len()), dec.ResetAfterBytes)
		hijackClose(w, raw.Bytes()[:n], true)
		return
	}
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	for _, k := range dec.RemoveHeaders {
		h.Del(k)
	}
	for _, k := range dec.GarbleHeaders {
		// Framing headers stay intact: garbling them would break the connection, which is
		// the reset fault's job.
		if !strings.EqualFold(k, "Content-Length") && !strings.EqualFold(k, "Transfer-Encoding") {
			h.Set(k, garbled)
		}
	}
	switch {
	case dec.BrokenGzip:
		body = brokenGzip(body)
		h.Set("Content-Encoding", "gzip")
		h.Del("Content-Length")
	case dec.Keep < 1:
		// Announce the whole body, deliver part: the client meets an unexpected EOF.
		h.Set("Content-Length", strconv.Itoa(len(body)))
		body = body[:int(float64(len(body))*dec.Keep)]
	default:
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(resp.StatusCode)
	bps := dec.SlowBodyBytesPerSec
	if dec.BytesPerSec > 0 && (bps == 0 || dec.BytesPerSec < bps) {
		bps = dec.BytesPerSec
	}
	writePaced(w, r, body, bps)
}

// garbled is what a garbled header holds: printable (clients still read the response) but
// no number, date, media type or token parses it.
const garbled = "=?;;%%garbled=;\"unterminated"

// writePaced writes body at bps bytes per second (0: at once), in chunks of 50 ms,
// flushing each so the client sees the pace.
func writePaced(w http.ResponseWriter, r *http.Request, body []byte, bps float64) {
	if bps <= 0 {
		_, _ = w.Write(body)
		return
	}
	chunk := max(1, int(bps/20))
	fl, _ := w.(http.Flusher)
	for len(body) > 0 {
		n := min(chunk, len(body))
		if _, err := w.Write(body[:n]); err != nil {
			return
		}
		if fl != nil {
			fl.Flush()
		}
		body = body[n:]
		if len(body) > 0 && !sleepCtx(r.Context(), time.Duration(float64(n)/bps*float64(time.Second))) {
			return
		}
	}
}

// brokenGzip gzips body and breaks the stream part-way: the header is valid, so a client
// starts decoding, and then meets corrupt data or an early end.
func brokenGzip(body []byte) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write(body)
	_ = zw.Close()
	z := b.Bytes()
	cut := max(11, len(z)/2) // keep the 10-byte header and a little data
	if cut > len(z) {
		cut = len(z)
	}
	z = z[:cut]
	for i := 10; i < len(z); i += 7 {
		z[i] ^= 0x5a
	}
	return z
}

// hijackClose takes over the client connection, writes prefix, and closes it: with a
// TCP RST when reset, else with an orderly close (a timeout's dead end).
func hijackClose(w http.ResponseWriter, prefix []byte, reset bool) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler) // net/http aborts the connection: the closest we can do
	}
	c, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	if len(prefix) > 0 {
		_, _ = buf.Write(prefix)
		_ = buf.Flush()
	}
	if tc, ok := c.(linger); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
