package faultfs

import (
	"context"
	"io/fs"
	"path"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// Gate is faultfs's decision point on its own, for callers that do the I/O themselves
// (package tools reaches a sandbox's workspace with openat2 or in-sandbox commands): it
// decides one file operation's storage faults, waits its delay and returns its abort as
// the error the kernel would give. An FS and a Gate over the same Decider name events
// alike (stream key "fs/<path>", the path slash-separated and rooted), so a file meets the
// same faults through either, and a replay of the same operations meets the same faults.
// A Gate is safe for concurrent use.
type Gate struct {
	d      *inject.Decider
	onFire func(key string, ev catalogue.Event, fired []catalogue.Fired)
	wait   func(ctx context.Context, d time.Duration) error
}

// NewGate returns a Gate over d. onFire, when not nil, receives every fault that fires,
// to be recorded as a step event. wait spends a delay (io_latency, iops_cap, the wait of
// lock_contention); nil sleeps on the wall clock, ending early with ctx. An env on virtual
// time passes a wait that advances its own clock instead.
func NewGate(d *inject.Decider, onFire func(key string, ev catalogue.Event, fired []catalogue.Fired), wait func(ctx context.Context, d time.Duration) error) *Gate {
	if wait == nil {
		wait = sleepCtx
	}
	return &Gate{d: d, onFire: onFire, wait: wait}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Event is the storage event of op on name (a path relative to the root, slash-separated)
// and its stream key.
func Event(op, name string) (key string, ev catalogue.Event) {
	ev = catalogue.Event{Layer: catalogue.LayerStorage, Op: op, Path: path.Clean("/" + name)}
	return "fs" + ev.Path, ev
}

// Before decides the faults of op on name, spends the delay, and returns the decision for
// the caller's rewrites (Decision.WriteKeep for short writes) and, when an abort fired,
// an *fs.PathError wrapping its errno ("write notes.txt: no space left on device"). An
// error from ctx while waiting is returned as is.
func (g *Gate) Before(ctx context.Context, op, name string) (catalogue.Decision, error) {
	key, ev := Event(op, name)
	dec := g.d.Decide(key, ev)
	if g.onFire != nil && len(dec.Fired) > 0 {
		g.onFire(key, ev, dec.Fired)
	}
	wait := dec.Delay
	if dec.IOPS > 0 {
		wait += time.Duration(float64(time.Second) / dec.IOPS)
	}
	if dec.Errno == syscall.EWOULDBLOCK {
		wait += dec.Hold
	}
	if wait > 0 {
		if err := g.wait(ctx, wait); err != nil {
			return dec, err
		}
	}
	if dec.Errno != 0 {
		return dec, &fs.PathError{Op: op, Path: name, Err: dec.Errno}
	}
	return dec, nil
}
