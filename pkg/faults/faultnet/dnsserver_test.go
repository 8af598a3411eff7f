package faultnet_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultnet"
)

// dnsServer starts a DNSServer on loopback UDP and TCP (same port) under spec.
func dnsServer(t *testing.T, spec string) (addr string, fired func() []string) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	s := &faultnet.DNSServer{
		D:        decider(t, spec),
		Hosts:    map[string][]netip.Addr{"api": {netip.MustParseAddr("127.0.0.1")}, "v6": {netip.MustParseAddr("::1")}},
		Services: map[string]string{"api": "api"},
		OnFire: func(key string, ev catalogue.Event, f []catalogue.Fired) {
			mu.Lock()
			defer mu.Unlock()
			for _, x := range f {
				got = append(got, key+" "+x.Kind+" "+ev.Service)
			}
		},
	}
	// The same port for UDP and TCP, as a resolver expects: a free UDP port's number may
	// be taken for TCP by another process, so try a few.
	var pc net.PacketConn
	var l net.Listener
	for attempt := 1; ; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if l, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		_ = pc.Close()
		if attempt == 20 {
			t.Fatalf("no port free for both UDP and TCP in %d attempts: %v", attempt, err)
		}
	}
	go func() { _ = s.ServePacket(pc) }()
	go func() { _ = s.Serve(l) }()
	t.Cleanup(func() { _ = s.Close() })
	return pc.LocalAddr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
}

func query(t *testing.T, id uint16, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDNSServer: answers, NXDOMAIN for unknown names, each DNS fault as a client meets
// it (Go's resolver, raw UDP and TCP), one decision per lookup.
func TestDNSServer(t *testing.T) {
	addr, fired := dnsServer(t, header+`  - {id: sf, kind: dns_servfail, match: {hosts: [broken]}}
  - {id: nx, kind: dns_nxdomain, match: {services: [api], ops: [lookup]}, probability: 0.5}
  - {id: to, kind: dns_timeout, match: {hosts: [silent]}, params: {after_ms: 200}}
`)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var de *net.DNSError
	if _, err := r.LookupHost(ctx, "elsewhere.example"); !errors.As(err, &de) || !de.IsNotFound {
		t.Errorf("unknown name: %v, want not found", err)
	}
	if _, err := r.LookupHost(ctx, "broken"); !errors.As(err, &de) || !de.IsTemporary || de.IsNotFound {
		t.Errorf("servfail: %v, want a temporary error", err)
	}
	if a, err := r.LookupHost(ctx, "v6"); err != nil || len(a) != 1 || a[0] != "::1" {
		t.Errorf("v6: %v %v", a, err)
	}
	// Go's resolver asks A and AAAA from a socket each (the A query decides, the AAAA
	// on its own meets no fault) and asks again after a SERVFAIL: a new decision.
	if f := fired(); len(f) < 2 || f[0] != "dns/broken dns_servfail " || f[len(f)-1] != f[0] {
		t.Errorf("fired %q, want servfails only", f)
	}

	// Raw UDP, as glibc asks: A then AAAA on one socket share the A query's decision (nx
	// has probability 0.5: the 20 lookups meet both outcomes, each recorded once), and
	// a second A query is decided anew.
	seen := map[dnsmessage.RCode]int{}
	for i := range 20 {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		var codes []dnsmessage.RCode
		for j, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write(query(t, uint16(i*2+j), "API.", typ)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 512)
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil || h.ID != uint16(i*2+j) || !h.Response {
				t.Fatalf("reply %+v: %v", h, err)
			}
			_ = p.SkipAllQuestions()
			ans, _ := p.AllAnswers()
			if h.RCode == dnsmessage.RCodeSuccess && typ == dnsmessage.TypeA && (len(ans) != 1 || ans[0].Body.(*dnsmessage.AResource).A != [4]byte{127, 0, 0, 1}) {
				t.Fatalf("A api: %v", ans)
			}
			if typ == dnsmessage.TypeAAAA && len(ans) != 0 {
				t.Fatalf("AAAA api: %v, want no data", ans)
			}
			codes = append(codes, h.RCode)
		}
		c.Close()
		if codes[0] != codes[1] {
			t.Fatalf("one lookup's A and AAAA met %v", codes)
		}
		seen[codes[0]]++
	}
	f := fired()
	if seen[dnsmessage.RCodeNameError] == 0 || seen[dnsmessage.RCodeSuccess] == 0 || len(f) != seen[dnsmessage.RCodeNameError] || f[0] != "dns/api dns_nxdomain api" {
		t.Errorf("20 lookups met %v, fired %q", seen, f)
	}

	// A retry (the same ids again on the same socket) is the same lookup; a new id after
	// the pair starts a new one, as a later lookup reusing the port would.
	rc, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []uint16{100, 101, 100, 101, 102} {
		_ = rc.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = rc.Write(query(t, id, "broken.", []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA}[i%2]))
		if _, err := rc.Read(make([]byte, 512)); err != nil {
			t.Fatal(err)
		}
		if f := fired(); len(f) != map[int]int{0: 1, 4: 1}[i] {
			t.Errorf("query %d (id %d) fired %q", i, id, f)
		}
	}
	rc.Close()

	// TCP: answers are length-prefixed; a timeout holds the connection after_ms, silent.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	send := func(name string) {
		q := query(t, 7, name, dnsmessage.TypeA)
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
			t.Fatal(err)
		}
	}
	send("elsewhere.")
	var lenb [2]byte
	if _, err := io.ReadFull(c, lenb[:]); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, binary.BigEndian.Uint16(lenb[:]))
	if _, err := io.ReadFull(c, msg); err != nil {
		t.Fatal(err)
	}
	var p dnsmessage.Parser
	if h, err := p.Start(msg); err != nil || h.RCode != dnsmessage.RCodeNameError {
		t.Errorf("tcp: %+v %v, want NXDOMAIN", h, err)
	}
	start := time.Now()
	send("silent.")
	n, err := c.Read(lenb[:])
	if took := time.Since(start); n != 0 || err == nil || took < 150*time.Millisecond {
		t.Errorf("tcp timeout: read %d, %v after %v; want nothing, then a close after 200 ms", n, err, took)
	}

	// A message with no question is a format error.
	u, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
	m, _ := b.Finish()
	_, _ = u.Write(m)
	_ = u.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	n, err = u.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := p.Start(buf[:n]); err != nil || h.RCode != dnsmessage.RCodeFormatError || h.ID != 9 {
		t.Errorf("no question: %+v %v, want FORMERR", h, err)
	}
}
