package ctrd

import (
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// defaultSeccomp is containerd's default seccomp profile for the spec's capabilities.
func defaultSeccomp(s *oci.Spec) *specs.LinuxSeccomp { return seccomp.DefaultProfile(s) }
