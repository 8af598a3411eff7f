package process

import (
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// deniedSyscalls are refused with EPERM inside every sandbox by bwrap's filter, unrecorded:
// calls ordinary tools probe (keyrings, clocks, io_uring — a large, often-exploited surface
// that bypasses per-syscall filtering —, userfaultfd, kcmp, syslog, quotas). The hostile
// calls (ptrace, mounts, namespaces, kexec, modules, bpf, perf…) are not here: they go to the
// per-exec notification filter of package safety, which refuses them with the same EPERM and
// records a syscall_denied event (an ERRNO here would take precedence and hide them). The
// rest of the syscall table is allowed: the sandbox user holds no capabilities, so
// privileged calls fail in the kernel anyway.
var deniedSyscalls = append([]uintptr{
	unix.SYS_KCMP, unix.SYS_USERFAULTFD, unix.SYS_QUOTACTL,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_SYSLOG, unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_ADJTIMEX,
	unix.SYS_CLOCK_ADJTIME, unix.SYS_VHANGUP,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
}, archDeniedSyscalls...)

// classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
const (
	bpfLdWAbs  = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK    = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfJgeK    = 0x35 // BPF_JMP | BPF_JGE | BPF_K
	bpfRetK    = 0x06 // BPF_RET | BPF_K
	retAllow   = 0x7fff0000
	retErrno   = 0x00050000
	retKillPro = 0x80000000
	offNr      = 0 // offsetof(struct seccomp_data, nr)
	offArch    = 4 // offsetof(struct seccomp_data, arch)
)

type sockFilter struct {
	code   uint16
	jt, jf uint8
	k      uint32
}

// seccompProgram returns the filter as the raw struct sock_filter array bwrap --seccomp
// reads: a wrong architecture kills the process, x32 syscalls (amd64) and deniedSyscalls
// return EPERM, everything else is allowed.
func seccompProgram() ([]byte, error) {
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: no audit arch for GOARCH %s", runtime.GOARCH)
	}
	n := len(deniedSyscalls)
	if n > 200 {
		return nil, fmt.Errorf("seccomp: %d denied syscalls exceed the jump range", n)
	}
	prog := []sockFilter{
		{bpfLdWAbs, 0, 0, offArch},
		{bpfJeqK, 1, 0, arch},
		{bpfRetK, 0, 0, retKillPro},
		{bpfLdWAbs, 0, 0, offNr},
	}
	// Jump targets count instructions after the jump; the deny return sits right after
	// the allow return at the end.
	if x32Bit != 0 {
		prog = append(prog, sockFilter{bpfJgeK, uint8(n + 1), 0, x32Bit})
	}
	for i, nr := range deniedSyscalls {
		prog = append(prog, sockFilter{bpfJeqK, uint8(n - i), 0, uint32(nr)})
	}
	prog = append(prog,
		sockFilter{bpfRetK, 0, 0, retAllow},
		sockFilter{bpfRetK, 0, 0, retErrno | uint32(unix.EPERM)},
	)
	out := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.NativeEndian.AppendUint16(out, f.code)
		out = append(out, f.jt, f.jf)
		out = binary.NativeEndian.AppendUint32(out, f.k)
	}
	return out, nil
}

var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}
