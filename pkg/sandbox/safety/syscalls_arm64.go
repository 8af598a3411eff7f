//go:build linux

package safety

import "golang.org/x/sys/unix"

// archHostile are arm64-only hostile calls (none).
var archHostile []Syscall

// x32Bit is zero: arm64 has no x32 ABI.
const x32Bit = 0

const nativeArch = unix.AUDIT_ARCH_AARCH64
