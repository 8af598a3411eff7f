package procfs

import (
	"os"
	"runtime"
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
