//go:build linux

package safety

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// classic BPF opcodes (linux/filter.h) and offsets in struct seccomp_data.
const (
	bpfLdWAbs = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK   = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfJgeK   = 0x35 // BPF_JMP | BPF_JGE | BPF_K
	bpfRetK   = 0x06 // BPF_RET | BPF_K
	offNr     = 0
	offArch   = 4
	offArg0   = 16 // args[i] at 16+8i; low word first (amd64 and arm64 are little-endian)
)

// insn is a BPF instruction whose jump targets are labels, resolved by assemble.
type insn struct {
	code   uint16
	jt, jf string // "" is the next instruction
	k      uint32
	label  string
}

func assemble(prog []insn) ([]unix.SockFilter, error) {
	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	out := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		off := func(l string) (uint8, error) {
			if l == "" {
				return 0, nil
			}
			t, ok := at[l]
			if !ok || t <= i || t-i-1 > 255 {
				return 0, fmt.Errorf("seccomp: bad jump from %d to %q", i, l)
			}
			return uint8(t - i - 1), nil
		}
		jt, err := off(in.jt)
		if err != nil {
			return nil, err
		}
		jf, err := off(in.jf)
		if err != nil {
			return nil, err
		}
		out[i] = unix.SockFilter{Code: in.code, Jt: jt, Jf: jf, K: in.k}
	}
	return out, nil
}

// Program returns the notification filter: a foreign architecture kills the process (the
// supervisor's names are for the native table only), x32 calls get EPERM, Hostile, connect
// sendmsg, sendmmsg and sendto with a destination address go to the supervisor, the rest is
// allowed.
func Program() ([]unix.SockFilter, error) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		return nil, fmt.Errorf("seccomp: GOARCH %s is not supported", runtime.GOARCH)
	}
	p := []insn{
		{code: bpfLdWAbs, k: offArch},
		{code: bpfJeqK, k: nativeArch, jf: "kill"},
		{code: bpfLdWAbs, k: offNr},
	}
	if x32Bit != 0 {
		p = append(p, insn{code: bpfJgeK, k: x32Bit, jt: "eperm"})
	}
	notified := append(slices.Clip(Hostile), sysConnect, sysSendmsg, sysSendmmsg) // never append into Hostile's array
	for _, s := range notified {
		p = append(p, insn{code: bpfJeqK, k: uint32(s.Nr), jt: "notify"})
	}
	p = append(p,
		insn{code: bpfJeqK, k: uint32(sysSendto.Nr), jt: "sendto"},
		insn{code: bpfRetK, k: unix.SECCOMP_RET_ALLOW},
		// sendto(fd, buf, len, flags, dest_addr, addrlen): only with a dest_addr.
		insn{code: bpfLdWAbs, k: offArg0 + 8*4, label: "sendto"},
		insn{code: bpfJeqK, k: 0, jf: "notify"},
		insn{code: bpfLdWAbs, k: offArg0 + 8*4 + 4},
		insn{code: bpfJeqK, k: 0, jf: "notify"},
		insn{code: bpfRetK, k: unix.SECCOMP_RET_ALLOW},
		insn{code: bpfRetK, k: unix.SECCOMP_RET_USER_NOTIF, label: "notify"},
		insn{code: bpfRetK, k: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM), label: "eperm"},
		insn{code: bpfRetK, k: unix.SECCOMP_RET_KILL_PROCESS, label: "kill"},
	)
	return assemble(p)
}

// InstallFilter installs Program on the calling thread (and, with allThreads, on every
// thread of the process: SECCOMP_FILTER_FLAG_TSYNC) and returns the listener fd the
// supervisor reads. Without allThreads the caller must hold the thread
// (runtime.LockOSThread) and never release it: processes it starts inherit the filter.
// It sets no_new_privs on the thread first, which the kernel requires of a process without
// CAP_SYS_ADMIN.
func InstallFilter(allThreads bool) (int, error) {
	prog, err := Program()
	if err != nil {
		return -1, err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("seccomp: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER)
	if allThreads {
		flags |= unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return -1, fmt.Errorf("seccomp: install the notification filter: %w (needs Linux ≥ 5.5, 5.7 for all threads)", errno)
	}
	return int(fd), nil
}

// Probe checks that this kernel accepts the notification filter, by installing it on a
// throwaway thread (which then ends, taking the filter with it). Runtimes call it at
// construction so that a host without user notification (Linux < 5.5) is refused up front
// rather than at the first exec.
func Probe() error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread and its filter end with this goroutine
		fd, err := InstallFilter(false)
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	return <-done
}
