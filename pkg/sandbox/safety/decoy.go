//go:build linux

package safety

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
//
// Every tripwire of the process shares one inotify instance (watcher): a user may hold
// only fs.inotify.max_user_instances of them (128 by default), far fewer than the execs a
// worker runs at once, while watches (three per tripwire) are plentiful. With an instance
// per tripwire, the 129th exec in flight on a host failed.
type Tripwire struct {
	wds    []int32
	opened map[string]bool // guarded by watcher.mu
}

// watcher is the process's one inotify instance, opened at the first WatchDecoys.
var watcher struct {
	mu sync.Mutex
	fd int // -1 until opened
	// watches are the live watches by descriptor. A sandbox's decoys have one watch
	// however many of its execs watch them (adding a watch on a watched file returns its
	// descriptor), held by every tripwire of those execs.
	watches map[int32]*decoyWatch
}

// decoyWatch is one watched decoy and the tripwires it reports to.
type decoyWatch struct {
	name  string
	trips map[*Tripwire]struct{}
}

func init() { watcher.fd = -1 }

// WatchDecoys starts watching the decoys CreateDecoys made in dir.
func WatchDecoys(dir string) (*Tripwire, error) {
	watcher.mu.Lock()
	defer watcher.mu.Unlock()
	if watcher.fd < 0 {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("decoys: inotify: %w", err)
		}
		watcher.fd, watcher.watches = fd, map[int32]*decoyWatch{}
	}
	// Opens made before this tripwire began belong to the tripwires then watching.
	drainLocked()
	t := &Tripwire{opened: map[string]bool{}}
	for _, n := range DecoyDevices {
		wd, err := unix.InotifyAddWatch(watcher.fd, filepath.Join(dir, n), unix.IN_OPEN)
		if err != nil {
			t.closeLocked()
			return nil, fmt.Errorf("decoys: watch /dev/%s: %w", n, err)
		}
		w := watcher.watches[int32(wd)]
		if w == nil {
			w = &decoyWatch{name: n, trips: map[*Tripwire]struct{}{}}
			watcher.watches[int32(wd)] = w
		}
		w.trips[t] = struct{}{}
		t.wds = append(t.wds, int32(wd))
	}
	return t, nil
}

// drainLocked reads every queued event and marks the decoy opened for each tripwire
// watching it. A watch the kernel dropped (its file deleted with its sandbox) is
// forgotten; inotify hands out descriptors cyclically, so its number is not reused
// soon. watcher.mu is held.
func drainLocked() {
	var buf [64 * (unix.SizeofInotifyEvent + 16)]byte
	for {
		n, err := unix.Read(watcher.fd, buf[:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 { // EAGAIN: the queue is empty
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if w := watcher.watches[ev.Wd]; w != nil {
				if ev.Mask&unix.IN_OPEN != 0 {
					for t := range w.trips {
						t.opened[w.name] = true
					}
				}
				if ev.Mask&unix.IN_IGNORED != 0 {
					delete(watcher.watches, ev.Wd)
				}
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// Events returns one device_access event per decoy opened since the watch began (or the
// last call). inotify merges identical unread events, so opens are not counted.
func (t *Tripwire) Events() []sandbox.Event {
	watcher.mu.Lock()
	drainLocked()
	opened := t.opened
	t.opened = map[string]bool{}
	watcher.mu.Unlock()
	var out []sandbox.Event
	for _, n := range DecoyDevices {
		if opened[n] {
			out = append(out, sandbox.Event{Kind: sandbox.EventDeviceAccess,
				Detail: fmt.Sprintf("/dev/%s opened: a decoy, empty; the host's device is not in the sandbox", n)})
		}
	}
	return out
}

// Close stops watching: a decoy no other tripwire watches loses its watch.
func (t *Tripwire) Close() {
	watcher.mu.Lock()
	defer watcher.mu.Unlock()
	t.closeLocked()
}

// closeLocked is Close with watcher.mu held.
func (t *Tripwire) closeLocked() {
	for _, wd := range t.wds {
		w := watcher.watches[wd]
		if w == nil {
			continue // dropped by the kernel
		}
		delete(w.trips, t)
		if len(w.trips) == 0 {
			delete(watcher.watches, wd)
			_, _ = unix.InotifyRmWatch(watcher.fd, uint32(wd)) // EINVAL when already dropped
		}
	}
	t.wds = nil
}
