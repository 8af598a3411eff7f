//go:build linux

package netns

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// refusalFilter is the classic BPF program of WatchRefusals: it passes (whole) the
// IPv4 and IPv6 packets on lo that are TCP with RST set, or ICMP "destination
// unreachable", and drops the rest in the kernel, so a watched namespace's ordinary
// traffic costs nothing here. The packet starts at its IP header (a SOCK_DGRAM packet
// socket). Jumps are relative to the next instruction.
var refusalFilter = []unix.SockFilter{
	/* 0 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 0},
	/* 1 */ {Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xf0},
	/* 2 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0x40, Jt: 0, Jf: 8}, // IPv4, else 11
	/* 3 */ {Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0}, // X = header length
	/* 4 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 9},
	/* 5 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.IPPROTO_TCP, Jt: 0, Jf: 2},
	/* 6 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_IND, K: 13}, // TCP flags
	/* 7 */ {Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: 0x04, Jt: 11, Jf: 12},
	/* 8 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.IPPROTO_ICMP, Jt: 0, Jf: 11},
	/* 9 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_IND, K: 0}, // ICMP type
	/* 10 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 3, Jt: 8, Jf: 9},
	/* 11 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0x60, Jt: 0, Jf: 8}, // IPv6
	/* 12 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 6},
	/* 13 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.IPPROTO_TCP, Jt: 0, Jf: 2},
	/* 14 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 40 + 13},
	/* 15 */ {Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, K: 0x04, Jt: 3, Jf: 4},
	/* 16 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.IPPROTO_ICMPV6, Jt: 0, Jf: 3},
	/* 17 */ {Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 40},
	/* 18 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 1, Jt: 0, Jf: 1},
	/* 19 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0xffff},
	/* 20 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0},
}

// WatchRefusals opens, in the network namespace named by nsPath, a packet socket on its
// loopback that receives the refusals the namespace's kernel sends there: the TCP
// resets and ICMP "destination unreachable" messages, each as one raw IP packet per
// Read (filtered in the kernel: nothing else is copied). A connection to a loopback port
// nothing listens on, or a datagram to one, is answered that way, and seen nowhere
// else. Only what lo receives is read (not the same packet again as sent). The file is
// non-blocking, on Go's poller: Close ends a Read.
func WatchRefusals(nsPath string) (*os.File, error) {
	var f *os.File
	err := inNetns(joiner(nsPath), func() error {
		// Protocol 0: nothing is received until bind, after the filter is attached.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		prog := unix.SockFprog{Len: uint16(len(refusalFilter)), Filter: unsafe.SliceData(refusalFilter)}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
			unix.Close(fd)
			return fmt.Errorf("attach filter: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			unix.Close(fd)
			return fmt.Errorf("ignore outgoing: %w", err)
		}
		lo, err := unix.NewIfreq("lo")
		if err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, lo); err != nil {
			unix.Close(fd)
			return fmt.Errorf("lo index: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: int(lo.Uint32())}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind to lo: %w", err)
		}
		f = os.NewFile(uintptr(fd), "refusals")
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("watch refusals in netns %s: %w", nsPath, err)
	}
	return f, nil
}

// htons is a port or protocol number in network order, as the kernel reads a uint16.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
