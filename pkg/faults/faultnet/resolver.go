package faultnet

import (
	"context"
	"net"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// Resolver resolves names through net.DefaultResolver unless a DNS fault fires: then
// lookups fail as a real resolver's do, with a *net.DNSError that says not found
// (NXDOMAIN), temporary (SERVFAIL) or timeout. Streams are keyed "dns/<host>".
type Resolver struct {
	D      *inject.Decider
	OnFire OnFire
	// Lookup resolves when no fault fires (nil: net.DefaultResolver.LookupHost).
	Lookup func(ctx context.Context, host string) ([]string, error)
}

// LookupHost resolves host.
func (r *Resolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	ev := catalogue.Event{Layer: catalogue.LayerNetwork, Op: catalogue.OpLookup, Host: host}
	key := "dns/" + host
	dec := r.D.Decide(key, ev)
	if r.OnFire != nil && len(dec.Fired) > 0 {
		r.OnFire(key, ev, dec.Fired)
	}
	if dec.Delay > 0 && !sleepCtx(ctx, dec.Delay) {
		return nil, ctx.Err()
	}
	switch dec.Abort {
	case catalogue.KindDNSNXDomain:
		return nil, &net.DNSError{Err: "no such host", Name: host, Server: "gauntlet", IsNotFound: true}
	case catalogue.KindDNSServFail:
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, Server: "gauntlet", IsTemporary: true}
	case catalogue.KindDNSTimeout:
		if !sleepCtx(ctx, dec.Hold) {
			return nil, ctx.Err()
		}
		return nil, &net.DNSError{Err: "i/o timeout", Name: host, Server: "gauntlet", IsTimeout: true, IsTemporary: true}
	}
	if r.Lookup != nil {
		return r.Lookup(ctx, host)
	}
	return net.DefaultResolver.LookupHost(ctx, host)
}

// Dialer dials through the Resolver and wraps every connection in Conn, keyed
// "dial/<host:port>/<n>".
type Dialer struct {
	Resolver *Resolver
	D        *inject.Decider
	OnFire   OnFire
	// Services maps a host to the service name events carry (optional).
	Services map[string]string

	counter keyCounter
}

// DialContext resolves addr's host (IP literals skip the resolver) and connects.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := host
	if net.ParseIP(host) == nil && d.Resolver != nil {
		addrs, err := d.Resolver.LookupHost(ctx, host)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		ip = addrs[0]
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, net.JoinHostPort(ip, port))
	if err != nil {
		return nil, err
	}
	key := d.counter.next("dial/" + addr)
	return WrapConn(c, d.D, key, catalogue.Event{Host: host, Service: d.Services[host]}, d.OnFire), nil
}

// sleepCtx waits d unless ctx ends first; it reports whether it slept fully.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
