//go:build linux

package safety_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/safety"
)

// The test binary doubles as the supervised program: with GAUNTLET_SAFETY_HELPER set it
// makes each call and prints the error it got.
func TestMain(m *testing.M) {
	if os.Getenv("GAUNTLET_SAFETY_HELPER") != "" {
		helper()
		return
	}
	os.Exit(m.Run())
}

func helper() {
	say := func(what string, err error) { fmt.Printf("%s: %v\n", what, err) }
	say("ptrace", syscall.PtraceAttach(1))
	say("mount", syscall.Mount("none", "/tmp", "tmpfs", 0, ""))
	fd, _ := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	say("connect-out", syscall.Connect(fd, &syscall.SockaddrInet4{Port: 80, Addr: [4]byte{192, 0, 2, 1}}))
	syscall.Close(fd)
	fd, _ = syscall.Socket(syscall.AF_INET6, syscall.SOCK_STREAM, 0)
	say("connect-out6", syscall.Connect(fd, &syscall.SockaddrInet6{Port: 443, Addr: [16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1}}))
	syscall.Close(fd)
	fd, _ = syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	say("connect-udp", syscall.Connect(fd, &syscall.SockaddrInet4{Port: 9, Addr: [4]byte{192, 0, 2, 9}}))
	syscall.Close(fd)
	fd, _ = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	say("connect-lo", syscall.Connect(fd, &syscall.SockaddrInet4{Port: 1, Addr: [4]byte{127, 0, 0, 1}}))
	syscall.Close(fd)
	fd, _ = syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	say("sendto-out", syscall.Sendto(fd, []byte("x"), 0, &syscall.SockaddrInet4{Port: 53, Addr: [4]byte{192, 0, 2, 53}}))
	syscall.Close(fd)
	fd, _ = syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
	say("sendmsg-out", syscall.Sendmsg(fd, []byte("x"), nil, &syscall.SockaddrInet4{Port: 123, Addr: [4]byte{192, 0, 2, 123}}, 0))
	say("sendmsg-lo", syscall.Sendmsg(fd, []byte("x"), nil, &syscall.SockaddrInet4{Port: 9, Addr: [4]byte{127, 0, 0, 1}}, 0))
	say("sendmmsg-out", sendmmsg(fd, [4]byte{192, 0, 2, 7}, 5353))
	syscall.Close(fd)
	for range 3 {
		_ = syscall.PtraceAttach(1)
	}
}

// sendmmsg sends one datagram to addr:port with sendmmsg (no wrapper in syscall or unix).
func sendmmsg(fd int, addr [4]byte, port uint16) error {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: addr}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], port)
	buf := []byte("x")
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(1)
	var m [1]struct {
		hdr unix.Msghdr
		n   uint32
		_   [4]byte
	}
	m[0].hdr.Name = (*byte)(unsafe.Pointer(&sa))
	m[0].hdr.Namelen = unix.SizeofSockaddrInet4
	m[0].hdr.Iov = &iov
	m[0].hdr.SetIovlen(1)
	_, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&m[0])), 1, 0, 0, 0)
	runtime.KeepAlive(&sa)
	runtime.KeepAlive(buf)
	if errno != 0 {
		return errno
	}
	return nil
}

// runSupervised runs the helper under the notification filter, started from a locked
// thread as the process runtime does, and returns its output, the recorded events and
// the egress attempts.
func runSupervised(t *testing.T) (string, []sandbox.Event, []sandbox.EgressAttempt) {
	t.Helper()
	rec := safety.NewRecorder()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GAUNTLET_SAFETY_HELPER=1")
	var out strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &out
	started := make(chan error, 1)
	release := make(chan struct{})
	var sup *safety.Supervisor
	go func() {
		runtime.LockOSThread() // never unlocked: the filtered thread ends with the goroutine
		fd, err := safety.InstallFilter(false)
		if err == nil {
			if sup, err = safety.Supervise(fd, rec, true); err == nil {
				err = cmd.Start()
			}
		}
		started <- err
		<-release
	}()
	defer close(release)
	if err := <-started; err != nil {
		t.Fatalf("start under the filter: %v", err)
	}
	err := cmd.Wait()
	sup.Close()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out.String())
	}
	egress, dropped := rec.DrainEgress()
	if dropped != 0 {
		t.Errorf("%d attempts dropped of a handful", dropped)
	}
	return out.String(), rec.Drain(), egress
}

func TestSupervisorRefusesAndRecords(t *testing.T) {
	out, events, egress := runSupervised(t)
	for _, want := range []string{
		"ptrace: operation not permitted",
		"mount: operation not permitted",
		"connect-out: network is unreachable",
		"connect-out6: network is unreachable",
		"connect-udp: network is unreachable",
		"connect-lo: connection refused", // loopback continues into the kernel
		"sendto-out: network is unreachable",
		"sendmsg-out: network is unreachable",
		"sendmsg-lo: <nil>", // a datagram to loopback is sent
		"sendmmsg-out: network is unreachable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("helper output %q lacks %q", out, want)
		}
	}
	has := func(kind sandbox.EventKind, what string) *sandbox.Event {
		i := slices.IndexFunc(events, func(e sandbox.Event) bool { return e.Kind == kind && strings.Contains(e.Detail, what) })
		if i < 0 {
			t.Errorf("no %s event about %q in %v", kind, what, events)
			return nil
		}
		return &events[i]
	}
	if e := has(sandbox.EventSyscallDenied, "ptrace refused"); e != nil && !strings.HasSuffix(e.Detail, "4 times") {
		t.Errorf("ptrace event %q: want the four attempts counted", e.Detail)
	}
	has(sandbox.EventSyscallDenied, "mount refused")
	has(sandbox.EventEgress, "connect to 192.0.2.1:80")
	has(sandbox.EventEgress, "connect to [2001:db8::1]:443")
	has(sandbox.EventEgress, "sendto to 192.0.2.53:53")
	has(sandbox.EventEgress, "sendmsg to 192.0.2.123:123")
	has(sandbox.EventEgress, "sendmmsg to 192.0.2.7:5353")
	has(sandbox.EventEgress, "connect to 192.0.2.9:9")
	if len(events) != 8 {
		t.Errorf("events %v: want eight (loopback is not egress)", events)
	}
	// Each attempt one by one, in order, with its socket's protocol (a UDP socket's
	// connect is UDP).
	want := []sandbox.EgressAttempt{
		{Addr: "192.0.2.1", Port: 80, Protocol: "TCP"},
		{Addr: "2001:db8::1", Port: 443, Protocol: "TCP"},
		{Addr: "192.0.2.9", Port: 9, Protocol: "UDP"},
		{Addr: "192.0.2.53", Port: 53, Protocol: "UDP"},
		{Addr: "192.0.2.123", Port: 123, Protocol: "UDP"},
		{Addr: "192.0.2.7", Port: 5353, Protocol: "UDP"},
	}
	if !slices.Equal(egress, want) {
		t.Errorf("egress attempts %+v, want %+v", egress, want)
	}
}

func TestProbe(t *testing.T) {
	if err := safety.Probe(); err != nil {
		t.Fatalf("this kernel must accept the notification filter: %v", err)
	}
}

func TestFilterIsWellFormed(t *testing.T) {
	prog, err := safety.Program()
	if err != nil {
		t.Fatal(err)
	}
	last := prog[len(prog)-1]
	if last.Code != 0x06 || last.K != unix.SECCOMP_RET_KILL_PROCESS {
		t.Fatalf("last instruction %+v, want ret KILL_PROCESS (foreign architectures)", last)
	}
	for i, in := range prog {
		if in.Code&0x07 == 0x05 && (i+1+int(in.Jt) >= len(prog) || i+1+int(in.Jf) >= len(prog)) {
			t.Fatalf("instruction %d jumps past the end", i)
		}
	}
}

func TestRecorderFoldsAndBounds(t *testing.T) {
	r := safety.NewRecorder()
	for i := range 40 {
		r.Add(sandbox.EventEgress, fmt.Sprintf("connect to 10.0.0.%d:80", i), "pid 2 (nc)")
	}
	r.Add(sandbox.EventSyscallDenied, "ptrace refused with EPERM", "pid 3 (gdb)")
	ev := r.Drain()
	// 16 destinations itemised, the ptrace attempt (not crowded out), a count of the rest.
	if len(ev) != 18 || ev[16].Kind != sandbox.EventSyscallDenied || ev[17].Detail != "24 more not itemised" || ev[17].Kind != sandbox.EventEgress {
		t.Fatalf("events %d: %+v", len(ev), ev)
	}
	if got := r.Drain(); len(got) != 0 {
		t.Fatalf("second drain %v, want empty", got)
	}
}

// TestRecorderKeepsEgressAttemptsUpToTheCap: every attempt is kept unfolded, repeats
// too, up to sandbox.MaxEgress, then counted; Drain and DrainEgress each forget only
// their own.
func TestRecorderKeepsEgressAttemptsUpToTheCap(t *testing.T) {
	r := safety.NewRecorder()
	for i := range sandbox.MaxEgress + 44 {
		r.AddEgress(sandbox.EgressAttempt{Addr: fmt.Sprintf("10.0.%d.%d", i/256, i%256), Port: 80, Protocol: "TCP"})
	}
	r.Add(sandbox.EventEgress, "connect to 10.0.0.0:80", "pid 2 (nc)")
	if ev := r.Drain(); len(ev) != 1 {
		t.Fatalf("events %v", ev)
	}
	got, dropped := r.DrainEgress()
	if len(got) != sandbox.MaxEgress || dropped != 44 || got[0].Addr != "10.0.0.0" || got[255].Addr != "10.0.0.255" {
		t.Fatalf("kept %d (first %+v), dropped %d: want %d and 44", len(got), got[0], dropped, sandbox.MaxEgress)
	}
	r.AddEgress(sandbox.EgressAttempt{Addr: "10.0.0.1", Port: 53, Protocol: "UDP"})
	r.AddEgress(sandbox.EgressAttempt{Addr: "10.0.0.1", Port: 53, Protocol: "UDP"})
	if got, dropped := r.DrainEgress(); len(got) != 2 || dropped != 0 {
		t.Fatalf("after a drain: %+v, dropped %d; want the two repeats kept", got, dropped)
	}
}

func TestDecoysAreEmptyAndWatched(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "decoy")
	if err := safety.CreateDecoys(dir); err != nil {
		t.Fatal(err)
	}
	tw, err := safety.WatchDecoys(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	if ev := tw.Events(); len(ev) != 0 {
		t.Fatalf("events before any open: %v", ev)
	}
	if _, err := os.Stat(filepath.Join(dir, "mem")); err != nil { // a stat is not an open
		t.Fatal(err)
	}
	for range 2 {
		b, err := os.ReadFile(filepath.Join(dir, "mem"))
		if err != nil || len(b) != 0 {
			t.Fatalf("decoy read %q %v, want empty", b, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "port"), []byte("x"), 0); err == nil && os.Geteuid() != 0 {
		t.Fatal("wrote a read-only decoy")
	}
	ev := tw.Events()
	if len(ev) < 1 || ev[0].Kind != sandbox.EventDeviceAccess || !strings.Contains(ev[0].Detail, "/dev/mem opened") {
		t.Fatalf("events %v, want /dev/mem opened", ev)
	}
	if err := safety.CreateDecoys(dir); err != nil { // idempotent
		t.Fatal(err)
	}
	if _, err := safety.WatchDecoys(filepath.Join(t.TempDir(), "none")); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("watching missing decoys: %v, want ENOENT", err)
	}
}

// More execs watch their sandboxes' decoys at once than a user may have inotify
// instances (fs.inotify.max_user_instances, 128 by default): each tripwire sees the opens
// of its own decoys only, two execs in one sandbox both see an open there, and one's
// Close leaves the other watching. With one instance per tripwire, the 129th exec of the
// host failed ("decoys: inotify: too many open files").
func TestTripwiresOutnumberInotifyInstances(t *testing.T) {
	limit := 128
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances"); err == nil {
		fmt.Sscan(string(b), &limit)
	}
	n := limit + 20
	root := t.TempDir()
	trips := make([]*safety.Tripwire, n)
	dirs := make([]string, n)
	for i := range n {
		dirs[i] = filepath.Join(root, fmt.Sprint(i))
		if err := safety.CreateDecoys(dirs[i]); err != nil {
			t.Fatal(err)
		}
		tw, err := safety.WatchDecoys(dirs[i])
		if err != nil {
			t.Fatalf("tripwire %d of %d (max_user_instances %d): %v", i+1, n, limit, err)
		}
		trips[i] = tw
	}
	// A second exec in sandbox 0.
	again, err := safety.WatchDecoys(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	for _, i := range []int{0, n - 1} {
		if _, err := os.ReadFile(filepath.Join(dirs[i], "kmem")); err != nil {
			t.Fatal(err)
		}
	}
	for i, tw := range trips {
		ev := tw.Events()
		opened := i == 0 || i == n-1
		if opened != (len(ev) == 1) || opened && !strings.Contains(ev[0].Detail, "/dev/kmem opened") {
			t.Errorf("tripwire %d: events %v, want one /dev/kmem open: %v", i, ev, opened)
		}
	}
	if ev := again.Events(); len(ev) != 1 {
		t.Errorf("the second tripwire of sandbox 0: events %v, want its /dev/kmem open", ev)
	}
	for _, tw := range trips {
		tw.Close()
	}
	if _, err := os.ReadFile(filepath.Join(dirs[0], "mem")); err != nil {
		t.Fatal(err)
	}
	if ev := again.Events(); len(ev) != 1 || !strings.Contains(ev[0].Detail, "/dev/mem opened") {
		t.Errorf("after the first tripwire of sandbox 0 closed, the second: events %v, want /dev/mem opened", ev)
	}
}
