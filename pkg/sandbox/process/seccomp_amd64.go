package process

import "golang.org/x/sys/unix"

// archDeniedSyscalls are amd64-only additions to deniedSyscalls (port I/O).
var archDeniedSyscalls = []uintptr{unix.SYS_IOPL, unix.SYS_IOPERM}

// x32Bit marks x32 ABI syscall numbers, refused wholesale.
const x32Bit = 0x40000000
