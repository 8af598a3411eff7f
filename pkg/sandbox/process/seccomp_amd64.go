package process

// archDeniedSyscalls are amd64-only additions to deniedSyscalls (none: iopl and ioperm
// are hostile, in package safety).
var archDeniedSyscalls []uintptr

// x32Bit marks x32 ABI syscall numbers, refused wholesale.
const x32Bit = 0x40000000
