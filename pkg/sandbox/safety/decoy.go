//go:build linux

package safety

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// DecoyDevices are the host devices a sandbox is shown as decoys, under /dev.
var DecoyDevices = []string{"mem", "kmem", "port"}

// CreateDecoys makes dir (0755) holding one empty, read-only (0444) regular file per name
// in DecoyDevices. Runtimes bind them read-only at /dev/NAME in one sandbox only, so an
// open is attributable to it. They hold nothing: reads return end of file, writes fail.
func CreateDecoys(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("decoys: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("decoys: %w", err)
	}
	for _, n := range DecoyDevices {
		p := filepath.Join(dir, n)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
			continue
		}
		_ = os.Remove(p)
		if err := os.WriteFile(p, nil, 0o444); err != nil {
			return fmt.Errorf("decoys: %w", err)
		}
		if err := os.Chmod(p, 0o444); err != nil {
			return fmt.Errorf("decoys: %w", err)
		}
	}
	return nil
}

// Tripwire watches a sandbox's decoys with inotify for the span of one exec. The kernel
// queues an IN_OPEN event when an open of the file succeeds, before open returns, so every
// open made by the command is in the queue once the command has exited.
type Tripwire struct {
	fd  int
	wds map[int32]string
}

// WatchDecoys starts watching the decoys CreateDecoys made in dir.
func WatchDecoys(dir string) (*Tripwire, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("decoys: inotify: %w", err)
	}
	t := &Tripwire{fd: fd, wds: map[int32]string{}}
	for _, n := range DecoyDevices {
		wd, err := unix.InotifyAddWatch(fd, filepath.Join(dir, n), unix.IN_OPEN)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("decoys: watch /dev/%s: %w", n, err)
		}
		t.wds[int32(wd)] = n
	}
	return t, nil
}

// Events returns one device_access event per decoy opened since the watch began (or the
// last call). inotify merges identical unread events, so opens are not counted.
func (t *Tripwire) Events() []sandbox.Event {
	opened := map[string]bool{}
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+16))
	for {
		n, err := unix.Read(t.fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 { // EAGAIN: the queue is empty
			break
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if ev.Mask&unix.IN_OPEN != 0 {
				if name, ok := t.wds[ev.Wd]; ok {
					opened[name] = true
				}
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	var out []sandbox.Event
	for _, n := range DecoyDevices {
		if opened[n] {
			out = append(out, sandbox.Event{Kind: sandbox.EventDeviceAccess,
				Detail: fmt.Sprintf("/dev/%s opened: a decoy, empty; the host's device is not in the sandbox", n)})
		}
	}
	return out
}

// Close stops watching.
func (t *Tripwire) Close() { unix.Close(t.fd) }
