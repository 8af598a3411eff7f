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
// All tripwires of a process share one inotify instance: the host allows a user 128 of
// them by default (fs.inotify.max_user_instances), and an instance per tripwire capped the
// sandboxes running a command at once at that. Each read of the shared queue hands every
// event to the tripwire that owns the watch.
type Tripwire struct {
	wds    map[int32]string // guarded by decoyWatch.mu
	opened map[string]bool  // guarded by decoyWatch.mu
	closed bool
}

// decoyWatch is the process's inotify instance for decoys.
var decoyWatch struct {
	mu      sync.Mutex
	fd      int // -1 until the first tripwire
	err     error
	watches map[int32]*decoyWatched
}

// decoyWatched is one watched decoy file and the tripwires watching it (two execs of one
// sandbox watch the same files, and inotify gives them the same watch).
type decoyWatched struct {
	name  string
	trips map[*Tripwire]bool
}

// WatchDecoys starts watching the decoys CreateDecoys made in dir.
func WatchDecoys(dir string) (*Tripwire, error) {
	w := &decoyWatch
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watches == nil {
		w.fd, w.err = unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if w.err != nil {
			w.err = fmt.Errorf("decoys: inotify: %w", w.err)
			w.fd = -1
		}
		w.watches = map[int32]*decoyWatched{}
	}
	if w.fd < 0 {
		return nil, w.err
	}
	t := &Tripwire{wds: map[int32]string{}, opened: map[string]bool{}}
	for _, n := range DecoyDevices {
		wd, err := unix.InotifyAddWatch(w.fd, filepath.Join(dir, n), unix.IN_OPEN)
		if err != nil {
			t.closeLocked()
			return nil, fmt.Errorf("decoys: watch /dev/%s: %w", n, err)
		}
		// Opens before this watch are not this tripwire's; read them out to their owners.
		drainDecoysLocked()
		wt := w.watches[int32(wd)]
		if wt == nil {
			wt = &decoyWatched{name: n, trips: map[*Tripwire]bool{}}
			w.watches[int32(wd)] = wt
		}
		wt.trips[t] = true
		t.wds[int32(wd)] = n
	}
	return t, nil
}

// drainDecoysLocked reads the shared queue and marks each event's decoy opened in the
// tripwires watching it. decoyWatch.mu is held.
func drainDecoysLocked() {
	w := &decoyWatch
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+16))
	for {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 { // EAGAIN: the queue is empty
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if ev.Mask&unix.IN_OPEN != 0 {
				if wt, ok := w.watches[ev.Wd]; ok {
					for t := range wt.trips {
						t.opened[wt.name] = true
					}
				}
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// Events returns one device_access event per decoy opened since the watch began (or the
// last call). inotify merges identical unread events, so opens are not counted.
func (t *Tripwire) Events() []sandbox.Event {
	decoyWatch.mu.Lock()
	if !t.closed {
		drainDecoysLocked()
	}
	opened := t.opened
	t.opened = map[string]bool{}
	decoyWatch.mu.Unlock()
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
func (t *Tripwire) Close() {
	decoyWatch.mu.Lock()
	defer decoyWatch.mu.Unlock()
	t.closeLocked()
}

func (t *Tripwire) closeLocked() {
	if t.closed {
		return
	}
	t.closed = true
	w := &decoyWatch
	for wd := range t.wds {
		wt := w.watches[wd]
		if wt == nil {
			continue
		}
		delete(wt.trips, t)
		if len(wt.trips) == 0 {
			delete(w.watches, wd)
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd))
		}
	}
	// Keep the queue short: the removals queue IN_IGNORED events.
	drainDecoysLocked()
}
