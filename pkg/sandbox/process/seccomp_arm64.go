package process

// archDeniedSyscalls are arm64-only additions to deniedSyscalls (none).
var archDeniedSyscalls []uintptr

// x32Bit is zero: arm64 has no x32 ABI.
const x32Bit = 0
