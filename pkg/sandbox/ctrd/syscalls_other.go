//go:build !amd64

package ctrd

// No precompiled seccomp filter off amd64: the OCI runtime compiles the profile.
var syscallNumbers = map[string]uint32{}

const (
	nativeAuditArch   = 0
	nativeSeccompArch = ""
	x32SyscallBit     = 0
)
