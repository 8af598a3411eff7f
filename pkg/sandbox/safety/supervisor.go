//go:build linux

package safety

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Kernel structures of the notification API (linux/seccomp.h).
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// ioctlNotifIDValid is SECCOMP_IOCTL_NOTIF_ID_VALID (SECCOMP_IOW(2, __u64)).
const ioctlNotifIDValid = 0x40082102

// Supervisor answers the notifications of one listener fd and records what it refused.
type Supervisor struct {
	fd    int
	stopR *os.File
	stopW *os.File
	rec   *Recorder
	armed atomic.Bool
	done  chan struct{}
	once  sync.Once
}

// Supervise starts answering listener's notifications in a goroutine; it takes ownership of
// the fd. Until Arm is called every call continues into the kernel unrecorded (the
// process runtime's trusted set-up, bwrap's own mounts, runs under the filter); when armed
// is true it is armed from the start.
func Supervise(listener int, rec *Recorder, armed bool) (*Supervisor, error) {
	r, w, err := os.Pipe()
	if err != nil {
		unix.Close(listener)
		return nil, err
	}
	s := &Supervisor{fd: listener, stopR: r, stopW: w, rec: rec, done: make(chan struct{})}
	s.armed.Store(armed)
	go s.loop()
	return s, nil
}

// Arm starts refusing and recording: every call from now on comes from the sandboxed
// command.
func (s *Supervisor) Arm() { s.armed.Store(true) }

// Close stops the supervisor and closes the listener. Processes still under the filter then
// get ENOSYS for the notified calls: they stay refused.
func (s *Supervisor) Close() {
	s.once.Do(func() {
		s.stopW.Close()
		<-s.done
		s.stopR.Close()
		unix.Close(s.fd)
	})
}

func (s *Supervisor) loop() {
	defer close(s.done)
	for {
		fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.stopR.Fd()), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			s.handle()
			continue
		}
		if fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
			// No process is left under the filter; wait for Close.
			<-waitReadable(s.stopR)
			return
		}
	}
}

func waitReadable(f *os.File) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		var b [1]byte
		_, _ = f.Read(b[:])
		close(ch)
	}()
	return ch
}

func (s *Supervisor) handle() {
	var n seccompNotif
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(s.fd), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&n))); errno != 0 {
		return // ENOENT: the caller died before we read it
	}
	resp := seccompNotifResp{ID: n.ID}
	errno := s.decide(&n)
	if errno == 0 {
		resp.Flags = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
	} else {
		resp.Error = -int32(errno)
	}
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(s.fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&resp)))
}

// decide returns the errno to fail the call with, or 0 to let it continue.
func (s *Supervisor) decide(n *seccompNotif) unix.Errno {
	if !s.armed.Load() {
		return 0
	}
	pid := int(n.Pid)
	if name, ok := syscallName(n.Data.Nr); ok {
		s.rec.Add(sandbox.EventSyscallDenied, name+" refused with EPERM", who(pid))
		return unix.EPERM
	}
	// Destinations: (pointer, length) pairs of socket addresses in the caller's memory.
	// Whatever cannot be read (the process made itself undumpable, or died) is left to
	// the kernel: the sandbox's network namespace has no route out anyway.
	var op string
	var dsts [][2]uint64
	switch uintptr(n.Data.Nr) {
	case sysConnect.Nr:
		op, dsts = "connect", [][2]uint64{{n.Data.Args[1], n.Data.Args[2]}}
	case sysSendto.Nr:
		op, dsts = "sendto", [][2]uint64{{n.Data.Args[4], n.Data.Args[5]}}
	case sysSendmsg.Nr, sysSendmmsg.Nr:
		// struct msghdr starts with msg_name and msg_namelen; struct mmsghdr is a
		// msghdr (56 bytes) and a length, 64 bytes in all. At most 8 of a vector are
		// looked at.
		op = "sendmsg"
		count, stride := uint64(1), uint64(0)
		if uintptr(n.Data.Nr) == sysSendmmsg.Nr {
			op, count, stride = "sendmmsg", min(n.Data.Args[2], 8), 64
		}
		if count == 0 {
			return 0
		}
		raw, ok := s.readMem(pid, n.ID, n.Data.Args[1], (count-1)*stride+16)
		if !ok {
			return 0
		}
		for i := uint64(0); i < count && int(i*stride+16) <= len(raw); i++ {
			h := raw[i*stride:]
			dsts = append(dsts, [2]uint64{binary.NativeEndian.Uint64(h), uint64(binary.NativeEndian.Uint32(h[8:]))})
		}
	default:
		return 0
	}
	var errno unix.Errno
	proto := ""
	for _, d := range dsts {
		if d[0] == 0 {
			continue // connected socket: its connect was checked
		}
		raw, ok := s.readMem(pid, n.ID, d[0], min(d[1], 128))
		if !ok {
			continue
		}
		dst, ok := parseSockaddr(raw)
		if !ok || dst.Addr().IsLoopback() || dst.Addr().IsUnspecified() {
			continue
		}
		s.rec.Add(sandbox.EventEgress, fmt.Sprintf("%s to %s refused (no route out of the sandbox)", op, dst), who(pid))
		if proto == "" {
			proto = sockProtocol(pid, n.Data.Args[0])
		}
		s.rec.AddEgress(sandbox.EgressAttempt{Addr: dst.Addr().String(), Port: int(dst.Port()), Protocol: proto})
		errno = unix.ENETUNREACH
	}
	return errno
}

// readMem reads the caller's argument memory, then checks the notification is still live
// (the pid was not reused meanwhile).
func (s *Supervisor) readMem(pid int, id, ptr, size uint64) ([]byte, bool) {
	if ptr == 0 || size < 2 {
		return nil, false
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		return nil, false
	}
	defer f.Close()
	buf := make([]byte, size)
	m, err := f.ReadAt(buf, int64(ptr))
	if m < 2 && err != nil {
		return nil, false
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(s.fd), ioctlNotifIDValid, uintptr(unsafe.Pointer(&id))); errno != 0 {
		return nil, false
	}
	return buf[:m], true
}

// parseSockaddr decodes an IPv4 or IPv6 socket address; other families are not egress.
func parseSockaddr(b []byte) (netip.AddrPort, bool) {
	if len(b) < 2 {
		return netip.AddrPort{}, false
	}
	switch binary.NativeEndian.Uint16(b) {
	case unix.AF_INET:
		if len(b) < 8 {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4])), true
	case unix.AF_INET6:
		if len(b) < 24 {
			return netip.AddrPort{}, false
		}
		a := netip.AddrFrom16([16]byte(b[8:24])).Unmap()
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[2:4])), true
	}
	return netip.AddrPort{}, false
}

// sockProtocol names the protocol of the caller's socket fd as an EgressAttempt does:
// "TCP", "UDP", "ICMP" (a ping socket) or another name the kernel gives it, read from
// the socket's "system.sockprotoname" attribute through /proc (the kernel's own names:
// TCP, TCPv6, MPTCP, UDP, UDPv6, UDP-Lite, PING, PINGv6, RAW, ...); "IP" when it
// cannot be read (the process died, or the fd changed under it).
func sockProtocol(pid int, fd uint64) string {
	var buf [32]byte
	m, err := unix.Getxattr("/proc/"+strconv.Itoa(pid)+"/fd/"+strconv.FormatUint(fd, 10), "system.sockprotoname", buf[:])
	if err != nil || m < 1 {
		return "IP"
	}
	return protocolName(string(bytes.TrimRight(buf[:m], "\x00")))
}

// protocolName maps a kernel protocol name (sockProtocol) to an EgressAttempt's.
func protocolName(name string) string {
	name = strings.ToUpper(strings.TrimSuffix(name, "v6"))
	switch {
	case name == "":
		return "IP"
	case name == "TCP" || name == "MPTCP":
		return "TCP"
	case name == "UDP" || strings.HasPrefix(name, "UDP-LITE") || name == "UDPLITE":
		return "UDP"
	case name == "PING":
		return "ICMP"
	}
	return name
}

// who names a process: "pid 12 (perl)".
func who(pid int) string {
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
}
