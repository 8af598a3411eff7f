package procfs

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A goroutine that enters a mount namespace of its own sees its mounts through
// MountInfo, and every other goroutine keeps seeing the host's: the view is the calling
// thread's, whichever thread of the process has wandered off.
func TestMountInfoIsTheCallingThreadsView(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root, as the sandbox runtimes do: run the suite as root (make test)")
	}
	dir := t.TempDir()
	type seen struct {
		inside bool
		err    error
	}
	done := make(chan seen, 1)
	release := make(chan struct{})
	go func() {
		// Never unlocked: the thread leaves with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			done <- seen{err: err}
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- seen{err: err}
			return
		}
		if err := unix.Mount("procfs-test", dir, "tmpfs", 0, "size=1m"); err != nil {
			done <- seen{err: err}
			return
		}
		b, err := MountInfo()
		done <- seen{inside: strings.Contains(string(b), " "+dir+" "), err: err}
		<-release // stay in the namespace while the test looks from outside
	}()
	defer close(release)
	in := <-done
	if in.err != nil {
		t.Fatal(in.err)
	}
	if !in.inside {
		t.Fatal("the goroutine in its own mount namespace does not see its tmpfs")
	}
	b, err := MountInfo()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), " "+dir+" ") {
		t.Fatal("another goroutine sees the tmpfs mounted in a namespace it never entered")
	}
}

// ParseMountInfo reads device, mount point and type across the optional fields, and skips
// what is not a mount line.
func TestParseMountInfo(t *testing.T) {
	got := ParseMountInfo([]byte(`30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime shared:9 master:1 - cgroup2 cgroup2 rw
not a mount line
88 26 0:61 / /tmp/ws rw,nosuid,nodev - fuse.gauntlet gauntlet rw,user_id=0
`))
	want := []Mount{
		{Device: "0:27", Point: "/sys/fs/cgroup", FSType: "tmpfs"},
		{Device: "0:37", Point: "/sys/fs/cgroup/unified", FSType: "cgroup2"},
		{Device: "0:61", Point: "/tmp/ws", FSType: "fuse.gauntlet"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseMountInfo = %+v, want %+v", got, want)
	}
}
