//go:build linux

package safety

import "golang.org/x/sys/unix"

// archHostile are amd64-only hostile calls (port I/O).
var archHostile = []Syscall{{"iopl", unix.SYS_IOPL}, {"ioperm", unix.SYS_IOPERM}}

// x32Bit marks x32 ABI syscall numbers, refused with EPERM by the filter.
const x32Bit = 0x40000000

const nativeArch = unix.AUDIT_ARCH_X86_64
