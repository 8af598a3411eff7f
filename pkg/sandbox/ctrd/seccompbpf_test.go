//go:build amd64

package ctrd

import (
	"encoding/base64"
	"encoding/binary"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// sandboxProfile is the profile every sandbox gets (no capabilities).
func sandboxProfile() *specs.LinuxSeccomp {
	return seccompProfile(&oci.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
}

// run evaluates the filter on one system call. x/net/bpf loads words big-endian, so
// every 32-bit field of seccomp_data is written big-endian here, which makes the VM
// see what the kernel sees (native words).
func run(t *testing.T, vm *bpf.VM, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))       // low word
		binary.BigEndian.PutUint32(data[16+8*i+4:], uint32(a>>32)) // high word
	}
	out, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(out)
}

func TestPrecompiledSeccompFollowsTheProfile(t *testing.T) {
	p := sandboxProfile()
	prog, ok, err := compileSeccomp(p)
	if err != nil || !ok {
		t.Fatalf("compile: ok=%v err=%v", ok, err)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	const arch = nativeAuditArch
	eperm := uint32(seccompRetErrno | uint32(unix.EPERM))
	// Every unconditionally allowed name of the profile is allowed.
	allowed := 0
	for _, sc := range p.Syscalls {
		if sc.Action != specs.ActAllow || len(sc.Args) > 0 {
			continue
		}
		for _, n := range sc.Names {
			nr, ok := syscallNumbers[n]
			if !ok {
				continue
			}
			if got := run(t, vm, arch, nr); got != seccompRetAllow {
				t.Errorf("%s: got %#x, want allow", n, got)
			}
			allowed++
		}
	}
	if allowed < 250 {
		t.Fatalf("only %d allowed system calls checked: profile not what was expected", allowed)
	}
	cases := []struct {
		name string
		nr   uint32
		args []uint64
		want uint32
	}{
		// Package safety's hostile calls are allowed at this level so that they reach the
		// agent's notification filter, which refuses them with EPERM and records them
		// (seccompProfile); an ERRNO here would take precedence and hide them.
		{"ptrace (left to the agent's filter)", unix.SYS_PTRACE, nil, seccompRetAllow},
		{"process_vm_readv (left to the agent's filter)", unix.SYS_PROCESS_VM_READV, nil, seccompRetAllow},
		{"mount (left to the agent's filter)", unix.SYS_MOUNT, nil, seccompRetAllow},
		{"unshare (left to the agent's filter)", unix.SYS_UNSHARE, nil, seccompRetAllow},
		{"bpf (left to the agent's filter)", unix.SYS_BPF, nil, seccompRetAllow},
		{"syslog (needs CAP_SYSLOG: not in the profile, not hostile)", unix.SYS_SYSLOG, nil, eperm},
		{"keyctl (not in the profile, not hostile)", unix.SYS_KEYCTL, nil, eperm},
		{"clone of a thread", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD}, seccompRetAllow},
		{"clone with CLONE_NEWUSER", unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER}, eperm},
		{"clone with CLONE_NEWNET", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNET | uint64(unix.SIGCHLD)}, eperm},
		{"clone3 (ENOSYS so libc falls back to clone)", unix.SYS_CLONE3, nil, seccompRetErrno | uint32(unix.ENOSYS)},
		{"socket AF_INET", unix.SYS_SOCKET, []uint64{unix.AF_INET}, seccompRetAllow},
		{"socket AF_UNIX", unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, seccompRetAllow},
		{"socket AF_VSOCK", unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, eperm},
		{"socket AF_VSOCK in the high word too", unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_INET}, eperm},
		{"personality(0)", unix.SYS_PERSONALITY, []uint64{0}, seccompRetAllow},
		{"personality(0xffffffff) query", unix.SYS_PERSONALITY, []uint64{0xffffffff}, seccompRetAllow},
		{"personality(READ_IMPLIES_EXEC)", unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm},
		{"unknown system call", 1000, nil, eperm},
		{"x32 read", x32SyscallBit | unix.SYS_READ, nil, eperm},
	}
	for _, c := range cases {
		if got := run(t, vm, arch, c.nr, c.args...); got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, got, c.want)
		}
	}
	if got := run(t, vm, 0x40000003 /* AUDIT_ARCH_I386 */, unix.SYS_READ); got != seccompRetKillProcess {
		t.Errorf("i386 call: got %#x, want kill", got)
	}
}

func TestPrecompiledSeccompArgumentOperators(t *testing.T) {
	const nr = unix.SYS_READ
	rule := func(op specs.LinuxSeccompOperator, v, v2 uint64) *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{
			DefaultAction: specs.ActErrno,
			Architectures: []specs.Arch{nativeSeccompArch},
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: v, ValueTwo: v2, Op: op}}}},
		}
	}
	big := uint64(5)<<32 | 7
	cases := []struct {
		op     specs.LinuxSeccompOperator
		v, v2  uint64
		arg    uint64
		allows bool
	}{
		{specs.OpEqualTo, big, 0, big, true},
		{specs.OpEqualTo, big, 0, 7, false},
		{specs.OpNotEqual, big, 0, big, false},
		{specs.OpNotEqual, big, 0, 7, true},
		{specs.OpNotEqual, big, 0, 6<<32 | 7, true},
		{specs.OpLessThan, big, 0, big - 1, true},
		{specs.OpLessThan, big, 0, big, false},
		{specs.OpLessThan, big, 0, 4<<32 | 0xffffffff, true},
		{specs.OpLessThan, big, 0, 6 << 32, false},
		{specs.OpLessEqual, big, 0, big, true},
		{specs.OpLessEqual, big, 0, big + 1, false},
		{specs.OpGreaterThan, big, 0, big + 1, true},
		{specs.OpGreaterThan, big, 0, big, false},
		{specs.OpGreaterThan, big, 0, 6 << 32, true},
		{specs.OpGreaterEqual, big, 0, big, true},
		{specs.OpGreaterEqual, big, 0, 4<<32 | 0xffffffff, false},
		{specs.OpMaskedEqual, 0xff00000000ff, 0x120000000034, 0x12ab000000cd34, false},
		{specs.OpMaskedEqual, 0xff00000000ff, 0x120000000034, 0xab1200ffff0034, true},
	}
	for _, c := range cases {
		prog, ok, err := compileSeccomp(rule(c.op, c.v, c.v2))
		if err != nil || !ok {
			t.Fatalf("%s: ok=%v err=%v", c.op, ok, err)
		}
		vm, err := bpf.NewVM(prog)
		if err != nil {
			t.Fatal(err)
		}
		got := run(t, vm, nativeAuditArch, nr, 0, 0, c.arg) == seccompRetAllow
		if got != c.allows {
			t.Errorf("%s value %#x/%#x, arg %#x: allowed=%v, want %v", c.op, c.v, c.v2, c.arg, got, c.allows)
		}
	}
}

func TestPrecompiledSeccompEncoding(t *testing.T) {
	data, err := seccompBPFData(sandboxProfile())
	if err != nil || data == "" {
		t.Fatalf("data %q, err %v", data, err)
	}
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw)%8 != 0 || len(raw)/8 > 4096 {
		t.Fatalf("%d bytes is not a loadable sock_filter array", len(raw))
	}
	// The first instruction loads the architecture: BPF_LD|BPF_W|BPF_ABS, k=4.
	if op, k := binary.NativeEndian.Uint16(raw), binary.NativeEndian.Uint32(raw[4:]); op != 0x20 || k != seccompDataArch {
		t.Fatalf("first instruction op %#x k %d", op, k)
	}
	// Profiles the compiler does not cover are left to the OCI runtime.
	p := sandboxProfile()
	p.Architectures = []specs.Arch{specs.ArchAARCH64}
	if _, ok, err := compileSeccomp(p); ok || err != nil {
		t.Fatalf("foreign-architecture profile: ok=%v err=%v, want not compiled", ok, err)
	}
}
