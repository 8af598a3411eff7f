package faultnet

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// DNSServer is a small authoritative name server that applies the decider's DNS faults:
// it answers the names of Hosts with their addresses and NXDOMAIN for every other
// name, without recursion (a sandbox has nowhere else to ask), unless a fault fires:
// dns_nxdomain answers NXDOMAIN, dns_servfail SERVFAIL, and dns_timeout no answer at all
// (the client's own timeout decides how long it waits; over TCP the connection is held
// for the fault's after_ms, then closed).
//
// One lookup is one event, keyed "dns/<name>" like Resolver's lookups, so it meets a
// fault whole and the fault is reported once. A lookup is what a client asks about one
// name from one socket: its first query, the query that follows it at once from the
// same socket about the same name with another id (glibc and busybox ask A, then AAAA),
// and any query resending one of those ids (a retry after a SERVFAIL or a silence).
// Source ports play no part beyond that, so a later lookup that happens to reuse a port
// is a new one. Over TCP the same holds per connection. UDP queries are handled one at
// a time in arrival order, so a sequence of lookups meets the same faults under the
// same seed. A client that asks A and AAAA from two sockets at once (Go's resolver)
// makes two lookups, which may meet the two draws in either order.
type DNSServer struct {
	// D decides the faults (nil: none).
	D *inject.Decider
	// OnFire receives every fault that fires (optional).
	OnFire OnFire
	// Hosts maps lower-case names (no trailing dot) to their addresses: IPv4 ones answer
	// A queries, IPv6 ones AAAA queries.
	Hosts map[string][]netip.Addr
	// Services maps a name to the service its events carry (optional).
	Services map[string]string
	// OnUnknown is told of each lookup of a name Hosts does not hold, once per lookup as
	// faults are decided (optional): the names a sandbox tried and was refused.
	OnUnknown func(name string)
	// Logger receives serving errors (default slog.Default()).
	Logger *slog.Logger

	mu      sync.Mutex
	closers map[io.Closer]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// lookups remembers a transport's recent lookups, to tell a lookup's further queries
// from new lookups. It holds at most maxLookups, forgetting the oldest.
type lookups struct {
	byKey map[lookupKey]*lookup
	order []lookupKey
	// first is the lookup the previous query started (nil when it started none): the
	// next query may be its companion.
	first    *lookup
	firstKey lookupKey
}

type lookupKey struct{ client, name string }

type lookup struct {
	dec catalogue.Decision
	ids []uint16
}

const maxLookups = 256

// of returns the decision of the query with id from client about name: its lookup's,
// or a new one from decide.
func (ls *lookups) of(client, name string, id uint16, decide func() catalogue.Decision) catalogue.Decision {
	k := lookupKey{client, name}
	first, firstKey := ls.first, ls.firstKey
	ls.first = nil
	if l, ok := ls.byKey[k]; ok && slices.Contains(l.ids, id) {
		return l.dec // a retry
	}
	if first != nil && firstKey == k && len(first.ids) == 1 {
		first.ids = append(first.ids, id) // the lookup's other question
		return first.dec
	}
	l := &lookup{dec: decide(), ids: []uint16{id}}
	if ls.byKey == nil {
		ls.byKey = map[lookupKey]*lookup{}
	}
	if _, ok := ls.byKey[k]; !ok {
		ls.order = append(ls.order, k)
		if len(ls.order) > maxLookups {
			delete(ls.byKey, ls.order[0])
			ls.order = ls.order[1:]
		}
	}
	ls.byKey[k] = l
	ls.first, ls.firstKey = l, k
	return l.dec
}

// DNS message sizes: a classic UDP message (the answers here are far smaller), and the
// largest query read.
const (
	dnsUDPSize  = 512
	dnsTCPIdle  = 10 * time.Second
	dnsMaxQuery = 4096
)

// ServePacket answers the queries arriving on pc until pc is closed (by Close or by
// the caller). It returns nil once closed.
func (s *DNSServer) ServePacket(pc net.PacketConn) error {
	if !s.track(pc, true) {
		_ = pc.Close()
		return nil
	}
	defer s.track(pc, false)
	buf := make([]byte, dnsMaxQuery)
	var ls lookups
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if stop, err := serveLoopErr(err); stop {
				return err
			}
			continue
		}
		resp, _, ok := s.answer(buf[:n], from.String(), &ls)
		if !ok {
			continue
		}
		if _, err := pc.WriteTo(resp, from); err != nil {
			s.logger().Debug("dns reply", "to", from, "err", err)
		}
	}
}

// serveLoopErr sorts the error of a read or an accept in a serve loop: stop, returning
// nil, once the socket is closed; go on after a timeout; stop with anything else.
func serveLoopErr(err error) (stop bool, ret error) {
	if errors.Is(err, net.ErrClosed) {
		return true, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, nil
	}
	return true, err
}

// Serve answers the queries of the TCP connections accepted on l until l is closed.
// It returns nil once closed.
func (s *DNSServer) Serve(l net.Listener) error {
	if !s.track(l, true) {
		_ = l.Close()
		return nil
	}
	defer s.track(l, false)
	for {
		c, err := l.Accept()
		if err != nil {
			if stop, err := serveLoopErr(err); stop {
				return err
			}
			continue
		}
		if !s.track(c, true) {
			_ = c.Close()
			return nil
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.track(c, false)
			defer c.Close()
			s.serveConn(c)
		}()
	}
}

// serveConn answers the length-prefixed queries of one TCP connection.
func (s *DNSServer) serveConn(c net.Conn) {
	client := "tcp/" + c.RemoteAddr().String()
	var ls lookups
	var lenb [2]byte
	for {
		_ = c.SetDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, lenb[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(lenb[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		resp, hold, ok := s.answer(q, client, &ls)
		if !ok {
			if hold > 0 {
				// Keep the client waiting until the hold ends or it leaves.
				_ = c.SetDeadline(time.Now().Add(hold))
				_, _ = io.Copy(io.Discard, c)
			}
			return
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer builds the reply to query q from client, ls being the transport's lookups. ok
// is false when there is none to send: a message that is no query, or a dns_timeout
// (hold: how long to keep a stream client waiting).
func (s *DNSServer) answer(q []byte, client string, ls *lookups) (resp []byte, hold time.Duration, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil, 0, false
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return reply(h, nil, dnsmessage.RCodeFormatError, nil), 0, true
	}
	question := qs[0]
	switch {
	case h.OpCode != 0:
		return reply(h, &question, dnsmessage.RCodeNotImplemented, nil), 0, true
	case question.Class != dnsmessage.ClassINET:
		return reply(h, &question, dnsmessage.RCodeRefused, nil), 0, true
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	dec := ls.of(client, name, h.ID, func() catalogue.Decision {
		if _, known := s.Hosts[name]; !known && s.OnUnknown != nil {
			s.OnUnknown(name)
		}
		return s.decide(name)
	})
	switch dec.Abort {
	case catalogue.KindDNSNXDomain:
		return reply(h, &question, dnsmessage.RCodeNameError, nil), 0, true
	case catalogue.KindDNSServFail:
		return reply(h, &question, dnsmessage.RCodeServerFailure, nil), 0, true
	case catalogue.KindDNSTimeout:
		return nil, dec.Hold, false
	}
	addrs, known := s.Hosts[name]
	if !known {
		return reply(h, &question, dnsmessage.RCodeNameError, nil), 0, true
	}
	return reply(h, &question, dnsmessage.RCodeSuccess, addrs), 0, true
}

// decide decides a new lookup of name, reporting what fired.
func (s *DNSServer) decide(name string) catalogue.Decision {
	ev := catalogue.Event{Layer: catalogue.LayerNetwork, Op: catalogue.OpLookup, Host: name, Service: s.Services[name]}
	key := "dns/" + name
	dec := s.D.Decide(key, ev)
	if s.OnFire != nil && len(dec.Fired) > 0 {
		s.OnFire(key, ev, dec.Fired)
	}
	return dec
}

// reply encodes an answer to h's question q (nil: none) with rcode and, on success, the
// addresses of the question's type.
func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, dnsUDPSize), dnsmessage.Header{
		ID: h.ID, Response: true, OpCode: h.OpCode, Authoritative: true,
		RecursionDesired: h.RecursionDesired, RCode: rcode})
	b.EnableCompression()
	// The builder fails only on misuse (sections out of order) or names it cannot
	// encode, which a parsed question never has: errors leave a shorter message.
	_ = b.StartQuestions()
	if q != nil {
		_ = b.Question(*q)
	}
	_ = b.StartAnswers()
	if q != nil {
		for _, a := range addrs {
			// TTL 0: every lookup asks again, so each one meets the faults.
			rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET}
			all := q.Type == dnsmessage.TypeALL
			switch {
			case a.Is4() && (q.Type == dnsmessage.TypeA || all):
				_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
			case a.Is6() && !a.Is4In6() && (q.Type == dnsmessage.TypeAAAA || all):
				_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

func (s *DNSServer) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// track adds or removes something Close must close; adding fails once closed.
func (s *DNSServer) track(c io.Closer, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.closers, c)
		return true
	}
	if s.closed {
		return false
	}
	if s.closers == nil {
		s.closers = map[io.Closer]struct{}{}
	}
	s.closers[c] = struct{}{}
	return true
}

// Close closes the sockets being served and open TCP connections, and waits for the
// connections' goroutines to end.
func (s *DNSServer) Close() error {
	s.mu.Lock()
	s.closed = true
	cs := make([]io.Closer, 0, len(s.closers))
	for c := range s.closers {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	s.wg.Wait()
	return nil
}
