package svcnet

import (
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// MethodUDP is Request.Method of a datagram refused on the sandbox's loopback.
const MethodUDP = "UDP"

// errNotDeclared is the Request.Error of a connection or datagram to a loopback port
// nothing listens on.
const errNotDeclared = "nothing listens on this port in the sandbox: it is no declared port of an allowed host"

// refused is one attempt the sandbox's kernel refused on its loopback.
type refused struct {
	dst    netip.Addr
	port   int
	method string
}

// serveRefusals reads the refusals the sandbox's kernel sends on its loopback
// (sandbox.RefusalWatcher) and records each as a denied request: the address and port the
// sandbox tried (an allowed host's name resolves to the loopback, so a port of it that
// is not declared is refused there), the protocol as the method, and the reason. The
// sandbox meets the refusal as before (connection refused, at once). Each is stamped
// with the time the kernel sent it, which orders it among the step's other entries;
// Settle reads what is queued without waiting for this goroutine (drainRefusals).
func (g *Gateway) serveRefusals(f *os.File) {
	defer g.wg.Done()
	rc, err := f.SyscallConn()
	if err == nil {
		// Stamp each packet with the kernel's time (best effort: else the time read).
		_ = rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) })
		err = rc.Read(func(fd uintptr) bool {
			g.drainFD(int(fd))
			return false // wait for more
		})
	}
	if err != nil && !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) && !g.isClosed() {
		g.opt.Logger.Warn("refusal watch stopped", "err", err)
	}
}

// drainRefusals records every refusal queued in the watch's socket, now, whichever
// goroutine asks: the reader's and Settle's reads are one at a time.
func (g *Gateway) drainRefusals() {
	if g.refusals == nil {
		return
	}
	rc, err := g.refusals.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) { g.drainFD(int(fd)) })
}

// drainFD reads the watch's socket fd until nothing is queued, recording each refusal.
func (g *Gateway) drainFD(fd int) {
	g.refMu.Lock()
	defer g.refMu.Unlock()
	if g.refBuf == nil {
		g.refBuf, g.refOOB = make([]byte, 2048), make([]byte, unix.CmsgSpace(16))
	}
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, g.refBuf, g.refOOB, unix.MSG_DONTWAIT)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return // EAGAIN: drained; another error: the reader's next wait reports it
		}
		at := packetTime(g.refOOB[:oobn])
		if a, ok := parseRefusal(g.refBuf[:n]); ok {
			g.request(Request{Host: a.dst.String(), Port: a.port, Method: a.method, Denied: true, Error: errNotDeclared, at: at})
		}
	}
}

// packetTime is the kernel's receive time of a packet (SCM_TIMESTAMPNS in oob), in
// nanoseconds since the epoch; the time now when there is none.
func packetTime(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
				// A struct timespec: seconds and nanoseconds, 64 bits each.
				sec, nsec := int64(binary.NativeEndian.Uint64(m.Data)), int64(binary.NativeEndian.Uint64(m.Data[8:]))
				if ns := sec*1e9 + nsec; ns > 0 {
					return ns
				}
			}
		}
	}
	return time.Now().UnixNano()
}

// parseRefusal reads a packet the kernel sent on lo (IPv4 or IPv6, no extension
// headers) and reports the attempt it refuses: a TCP reset answering a SYN (RST and ACK,
// sequence 0: RFC 793's answer to a segment without ACK, which only a SYN to a closed
// port gets; a connection's own reset carries its sequence number), from the address
// and port tried; or an ICMP "port unreachable" quoting a UDP datagram, to them.
func parseRefusal(p []byte) (refused, bool) {
	var (
		src     netip.Addr
		proto   byte
		payload []byte
	)
	v6 := false
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		hl := int(p[0]&0x0f) * 4
		if hl < 20 || len(p) < hl {
			return refused{}, false
		}
		src, proto, payload = netip.AddrFrom4([4]byte(p[12:16])), p[9], p[hl:]
	case len(p) >= 40 && p[0]>>4 == 6:
		src, proto, payload, v6 = netip.AddrFrom16([16]byte(p[8:24])), p[6], p[40:], true
	default:
		return refused{}, false
	}
	switch {
	case proto == 6 && len(payload) >= 14:
		const rstAck = 0x14
		if payload[13]&rstAck == rstAck && binary.BigEndian.Uint32(payload[4:]) == 0 {
			return refused{src, int(binary.BigEndian.Uint16(payload[0:])), MethodTCP}, true
		}
	case !v6 && proto == 1 && len(payload) >= 8 && payload[0] == 3 && payload[1] == 3,
		v6 && proto == 58 && len(payload) >= 8 && payload[0] == 1 && payload[1] == 4:
		// The quoted datagram: its header, then its UDP header's ports.
		q := payload[8:]
		switch {
		case !v6 && len(q) >= 20 && q[0]>>4 == 4 && q[9] == 17:
			hl := int(q[0]&0x0f) * 4
			if len(q) >= hl+4 {
				return refused{netip.AddrFrom4([4]byte(q[16:20])), int(binary.BigEndian.Uint16(q[hl+2:])), MethodUDP}, true
			}
		case v6 && len(q) >= 44 && q[0]>>4 == 6 && q[6] == 17:
			return refused{netip.AddrFrom16([16]byte(q[24:40])), int(binary.BigEndian.Uint16(q[42:])), MethodUDP}, true
		}
	}
	return refused{}, false
}
