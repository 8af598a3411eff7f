package svcnet

import (
	"encoding/binary"
	"strconv"
	"testing"
)

// ip4 is an IPv4 packet from src to dst of protocol proto carrying payload.
func ip4(src, dst [4]byte, proto byte, payload []byte) []byte {
	p := make([]byte, 20, 20+len(payload))
	p[0], p[9] = 0x45, proto
	binary.BigEndian.PutUint16(p[2:], uint16(20+len(payload)))
	copy(p[12:], src[:])
	copy(p[16:], dst[:])
	return append(p, payload...)
}

// ip6 is an IPv6 packet from src to dst of next header proto carrying payload.
func ip6(src, dst [16]byte, proto byte, payload []byte) []byte {
	p := make([]byte, 40, 40+len(payload))
	p[0], p[6] = 0x60, proto
	binary.BigEndian.PutUint16(p[4:], uint16(len(payload)))
	copy(p[8:], src[:])
	copy(p[24:], dst[:])
	return append(p, payload...)
}

// tcp is a TCP header from port sport to dport with seq and flags.
func tcp(sport, dport uint16, seq uint32, flags byte) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h, sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint32(h[4:], seq)
	h[12], h[13] = 5<<4, flags
	return h
}

// TestParseRefusal: the kernel's answers to a SYN or a datagram at a closed port are
// read as refused attempts (the address and port tried, the protocol); a connection's
// own reset, other ICMP and other packets are not.
func TestParseRefusal(t *testing.T) {
	lo4 := [4]byte{127, 0, 0, 1}
	lo6 := [16]byte{15: 1}
	udp := func(dport uint16) []byte {
		h := make([]byte, 8)
		binary.BigEndian.PutUint16(h, 40000)
		binary.BigEndian.PutUint16(h[2:], dport)
		return h
	}
	icmp := func(typ, code byte, quoted []byte) []byte {
		return append([]byte{typ, code, 0, 0, 0, 0, 0, 0}, quoted...)
	}
	for _, c := range []struct {
		name string
		p    []byte
		want string // "" for none
	}{
		{"refused SYN, IPv4", ip4(lo4, lo4, 6, tcp(5999, 40000, 0, 0x14)), "127.0.0.1 5999 TCP"},
		{"refused SYN, IPv6", ip6(lo6, lo6, 6, tcp(5999, 40000, 0, 0x14)), "::1 5999 TCP"},
		{"a connection's own reset", ip4(lo4, lo4, 6, tcp(5999, 40000, 12345, 0x14)), ""},
		{"a plain ACK", ip4(lo4, lo4, 6, tcp(5999, 40000, 0, 0x10)), ""},
		{"port unreachable, IPv4", ip4(lo4, lo4, 1, icmp(3, 3, ip4(lo4, [4]byte{127, 0, 0, 2}, 17, udp(5998)))), "127.0.0.2 5998 UDP"},
		{"port unreachable, IPv6", ip6(lo6, lo6, 58, icmp(1, 4, ip6(lo6, lo6, 17, udp(5998)))), "::1 5998 UDP"},
		{"host unreachable", ip4(lo4, lo4, 1, icmp(3, 1, ip4(lo4, lo4, 17, udp(5998)))), ""},
		{"truncated", ip4(lo4, lo4, 6, tcp(5999, 40000, 0, 0x14)[:10]), ""},
		{"not IP", []byte{0x20, 1, 2}, ""},
	} {
		got := ""
		if a, ok := parseRefusal(c.p); ok {
			got = a.dst.String() + " " + strconv.Itoa(a.port) + " " + a.method
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
