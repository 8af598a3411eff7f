// Package procfs reads what /proc says about this process as the calling thread sees it.
//
// Go code that enters another namespace does so on a locked thread (faultfuse mounts its
// layer inside a container's mount namespace that way). When that thread is the process's
// main thread, the runtime neither reuses it nor lets it exit, so from then on
// /proc/self, which is the main thread's view, describes the container, not the host:
// the sandbox runtimes read "cgroup v1 controllers not mounted", containerd's local
// server could not find (and so not detach) its own root tmpfs, and tests failed in a
// row. /proc/thread-self is the view of the thread asking.
package procfs

import (
	"fmt"
	"os"
	"strings"
)

// MountInfoPath is the mount table of the calling thread's mount namespace.
const MountInfoPath = "/proc/thread-self/mountinfo"

// MountInfo returns the calling thread's mount table (see proc(5), mountinfo). Call it
// from a goroutine that has not entered another mount namespace.
func MountInfo() ([]byte, error) {
	b, err := os.ReadFile(MountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return b, nil
}

// Mount is one line of a mount table, the fields gauntlet reads. Paths are as the
// kernel writes them (a space in one is "\040").
type Mount struct {
	// Device is the filesystem's "major:minor".
	Device string
	// Point is where it is mounted.
	Point string
	// FSType is its type ("tmpfs", "cgroup2", "fuse.gauntlet", ...).
	FSType string
}

// Mounts returns the calling thread's mount table, parsed; see MountInfo.
func Mounts() ([]Mount, error) {
	b, err := MountInfo()
	if err != nil {
		return nil, err
	}
	return ParseMountInfo(b), nil
}

// ParseMountInfo parses a mount table in the format of /proc/PID/mountinfo, skipping
// lines it cannot read.
func ParseMountInfo(b []byte) []Mount {
	var out []Mount
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// id parent major:minor root point options [optional fields...] - type source super
		for i := 6; i+1 < len(f); i++ {
			if f[i] == "-" {
				out = append(out, Mount{Device: f[2], Point: f[4], FSType: f[i+1]})
				break
			}
		}
	}
	return out
}
