//go:build linux

package safety

import "golang.org/x/sys/unix"

// Syscall is one system call the notification filter sends to the supervisor.
type Syscall struct {
	Name string
	Nr   uintptr
}

// Hostile are the calls refused with EPERM and recorded as syscall_denied: reaching into
// other processes, changing the kernel, mounts and namespaces, swap, reboot, accounting,
// handle-based opens that escape mount confinement, port I/O. No ordinary program needs them
// in a sandbox (quieter refusals that tools probe routinely — io_uring, keyrings, clocks,
// userfaultfd — stay plain EPERM in each runtime's own filter, unrecorded).
var Hostile = append([]Syscall{
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"bpf", unix.SYS_BPF},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"fspick", unix.SYS_FSPICK},
	{"setns", unix.SYS_SETNS},
	{"unshare", unix.SYS_UNSHARE},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"reboot", unix.SYS_REBOOT},
	{"acct", unix.SYS_ACCT},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
}, archHostile...)

// Network calls the supervisor inspects: connect, sendmsg and sendmmsg always (their
// destination sits behind a pointer the filter cannot follow), sendto only with a
// destination address (the filter checks the pointer argument is non-null).
var (
	sysConnect  = Syscall{"connect", unix.SYS_CONNECT}
	sysSendto   = Syscall{"sendto", unix.SYS_SENDTO}
	sysSendmsg  = Syscall{"sendmsg", unix.SYS_SENDMSG}
	sysSendmmsg = Syscall{"sendmmsg", unix.SYS_SENDMMSG}
)

// HostileNames returns the names of Hostile, for OCI seccomp profiles.
func HostileNames() []string {
	out := make([]string, len(Hostile))
	for i, s := range Hostile {
		out[i] = s.Name
	}
	return out
}

func syscallName(nr int32) (string, bool) {
	for _, s := range Hostile {
		if int32(s.Nr) == nr {
			return s.Name, true
		}
	}
	return "", false
}
