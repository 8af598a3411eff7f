package svcnet

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultnet"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Request is one HTTP request a sandbox made through its egress gateway, one TLS
// connection relayed (or refused) on one of its TLS ports, one plain TCP connection
// relayed on one of its TCP ports, one lookup of a name it may not reach, or one
// attempt to reach an address (a TCP connection, a UDP datagram, a ping), refused, as a
// step records it.
type Request struct {
	// Host is the host the request named (its Host header, or its absolute URL's host;
	// a TLS connection's server name), lower-case, without port; empty for a TLS
	// connection that named none; the address an attempt to reach one was sent to.
	Host string `json:"host"`
	// Port is a TLS or TCP connection's port, or an attempt's TCP or UDP port (0 for
	// HTTP requests, on the service's port 80, lookups and pings).
	Port int `json:"port,omitempty"`
	// Method is the request's method; "TLS" for a TLS connection, "TCP" for a plain TCP
	// one, "DNS" for a refused lookup; an attempt's protocol, "TCP", "UDP" or "ICMP".
	Method string `json:"method"`
	// Path is the request's path (empty for a lookup, a CONNECT or a TLS connection).
	Path string `json:"path,omitempty"`
	// Status is the answer's status code; 0 when none was sent (a reset, a timeout, a
	// lookup, a TLS connection).
	Status int `json:"status"`
	// Bytes are the bytes of the answer's body the sandbox was sent; of a TLS or TCP
	// connection, every byte the host sent it.
	Bytes int64 `json:"bytes"`
	// BytesUp are, of a TLS or TCP connection, the bytes the sandbox sent the host (a
	// ClientHello included).
	BytesUp int64 `json:"bytes_up,omitempty"`
	// Faults are the kinds of the faults that met the request, in the order they fired.
	Faults []string `json:"faults,omitempty"`
	// Denied: the host is not one the sandbox may reach; the request or lookup was
	// refused and went nowhere.
	Denied bool `json:"denied,omitempty"`
	// Error says why a TLS or TCP connection, or an attempt to reach an address, was
	// refused or ended without reaching its host.
	Error string `json:"error,omitempty"`
	// Dropped is, on a Recorder's entry of method MethodDropped, how many denied
	// requests it dropped past MaxDenied.
	Dropped int64 `json:"dropped,omitempty"`

	// at is when the gateway first saw the request or connection (its arrival, its
	// accept, the kernel's refusal), in nanoseconds since the epoch: a Recorder orders a
	// step's entries by it. 0 for an attempt the runtime reported (Recorder.OnEgress).
	at int64
}

// MethodDNS is Request.Method of a refused lookup.
const MethodDNS = "DNS"

// egressHandler is the gateway of an egress service: the sandbox's allowed hosts
// (s.Hosts) resolve to the sandbox's loopback, where this handler takes every request,
// refuses those to other hosts (403, recorded as denied) and CONNECT tunnels (no proxy
// is needed: a client reaches https://host/ directly, through the service's TLS ports,
// serveTLS), and forwards the rest through the fault proxy, one decision per request keyed
// "http/<host>" and selected by the rules for the service (and by hosts), to where the
// runtime says the host is reached (sandbox.HostMapper),
// else to the host itself. Origin-form requests (a client that resolved the name) and
// absolute-form ones (a client configured with http_proxy) are treated alike.
func (g *Gateway) egressHandler(rt sandbox.Runtime, s sandbox.Service) http.Handler {
	ups := make(map[string]*url.URL, len(s.Hosts))
	hm, _ := rt.(sandbox.HostMapper)
	for _, h := range s.Hosts {
		u := &url.URL{Scheme: "http", Host: h}
		if hm != nil {
			if addr, ok := hm.HostUpstream(h, sandbox.HTTPPort); ok {
				u.Host = addr
			}
		}
		ups[h] = u
	}
	allowed := strings.Join(slices.Sorted(maps.Keys(ups)), ", ")
	if allowed == "" {
		allowed = "none"
	}
	// Requests are decided as the service's (the plan's rules for it select them) and
	// recorded on the host they named.
	svc := make(map[string]string, len(ups))
	for h := range ups {
		svc[h] = s.Name
	}
	nd := &net.Dialer{Timeout: g.opt.DialTimeout}
	// A host that stops reading a request's body holds it, not Settle (traced).
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return watchStalls(c), nil
	}
	base := faultnet.Proxy{
		D:         g.opt.Decider,
		Upstreams: ups,
		Services:  svc,
		// A plain transport: the faults act once, in the proxy.
		Transport: &http.Transport{DialContext: dial, DisableCompression: true, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if r.URL.IsAbs() {
			host = r.URL.Host
		}
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		req := Request{Host: host, Method: r.Method, Path: r.URL.Path, at: time.Now().UnixNano()}
		_, ok := ups[host]
		if !ok || r.Method == http.MethodConnect {
			msg := fmt.Sprintf("gauntlet: host %q is not allowed in this sandbox (allowed hosts: %s)\n", host, allowed)
			if ok {
				msg = fmt.Sprintf("gauntlet: CONNECT to %q refused: no proxy is needed, connect to the host itself (https://%s/ reaches it through gauntlet's gateway)\n", host, host)
			}
			if r.Method == http.MethodConnect {
				req.Path = ""
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusForbidden)
			n, _ := fmt.Fprint(w, msg)
			req.Status, req.Bytes, req.Denied = http.StatusForbidden, int64(n), true
			g.request(req)
			return
		}
		if r.URL.IsAbs() {
			u := *r.URL
			u.Scheme, u.Host, u.User = "", "", nil
			r.URL = &u
		}
		r.Host = host
		// A reset or a timeout takes the connection over and ends it: the request is
		// recorded then, before the sandbox sees that end, so with the command it ends.
		recorded := false
		cw := &countingWriter{ResponseWriter: w, onHijack: func() {
			req.Status, req.Bytes, recorded = 0, 0, true
			g.request(req)
		}}
		p := base
		p.OnFire = func(key string, ev catalogue.Event, fired []catalogue.Fired) {
			ev.Service = "" // recorded on the host
			if g.opt.OnFire != nil {
				g.opt.OnFire(key, ev, fired)
			}
			for _, f := range fired {
				req.Faults = append(req.Faults, f.Kind)
			}
		}
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		p.ServeHTTP(cw, g.traced(c, r))
		g.sendsOn(c, nil)
		if recorded {
			return
		}
		req.Status, req.Bytes = cw.status, cw.n
		g.request(req)
	})
}

// traced returns r, served on the sandbox's connection c (nil: r), with a client trace
// that notes on c's flight the connection to the host r is sent on, until the host
// begins to answer (sendsOn): while the host stops reading r's body, the body waits for
// the host, not for the gateway.
func (g *Gateway) traced(c net.Conn, r *http.Request) *http.Request {
	if c == nil {
		return r
	}
	return r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { g.sendsOn(c, i.Conn) },
		GotFirstResponseByte: func() { g.sendsOn(c, nil) },
	}))
}

// request reports a request to Options.OnRequest.
func (g *Gateway) request(r Request) {
	if g.opt.OnRequest != nil {
		g.opt.OnRequest(r)
	}
}

// countingWriter notes the status and the body bytes a handler sends, and calls
// onHijack when it takes the connection over (a reset or a timeout: no answer).
type countingWriter struct {
	http.ResponseWriter
	status   int
	n        int64
	onHijack func()
}

func (c *countingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// Flush passes on to the server's writer, which paced bodies need.
func (c *countingWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack passes on to the server's writer, which resets and timeouts need.
func (c *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := c.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	if c.onHijack != nil {
		c.onHijack()
	}
	return hj.Hijack()
}
