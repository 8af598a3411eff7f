//go:build linux

package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/faultfuse"
)

// Storage faults for commands: AttachStorageFaults sets up a faultfuse layer over
// the sandbox's workspace; while it is attached, every exec mounts it at
// <run dir>/<id>.fuse for the span of the command (faultfuse.Layer Begin/End) and binds
// that mount (instead of the overlay) at sandbox.WorkspacePath, so each file operation of
// the command's processes passes the gate. The host-side file tools keep using the overlay directly,
// behind their own gate.

var _ sandbox.StorageFaulter = (*Runtime)(nil)

// fuseDir is the layer's mount point, beside the workspace's so the unprivileged launcher
// can reach it.
func (r *Runtime) fuseDir(id string) string { return filepath.Join(r.runDir, id+".fuse") }

// shadowDir is where the layer binds the workspace while a command runs; root only.
func (r *Runtime) shadowDir(id string) string { return r.path("shadow", id) }

// AttachStorageFaults implements sandbox.StorageFaulter.
func (r *Runtime) AttachStorageFaults(ctx context.Context, id string, gate *faultfs.Gate) error {
	if gate == nil {
		return fmt.Errorf("attach storage faults %s: %w: gate: required", id, sandbox.ErrInvalid)
	}
	b, err := r.lock("attach storage faults", id)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	if err := r.detachFuse(b); err != nil {
		return fmt.Errorf("attach storage faults %s: %w", id, err)
	}
	mnt, shadow := r.fuseDir(id), r.shadowDir(id)
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return fmt.Errorf("attach storage faults %s: %w", id, err)
	}
	if err := os.MkdirAll(filepath.Dir(shadow), 0o700); err != nil {
		return fmt.Errorf("attach storage faults %s: %w", id, err)
	}
	if err := os.Mkdir(shadow, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("attach storage faults %s: %w", id, err)
	}
	l, err := faultfuse.Open(faultfuse.Config{Workspace: r.workspace(b.rec), Mountpoint: mnt, Shadow: shadow, Gate: gate})
	if err != nil {
		return fmt.Errorf("attach storage faults %s: %w: %v", id, sandbox.ErrUnavailable, err)
	}
	b.fuse = l
	return nil
}

// DetachStorageFaults implements sandbox.StorageFaulter.
func (r *Runtime) DetachStorageFaults(ctx context.Context, id string) error {
	b, err := r.lock("detach storage faults", id)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	if err := r.detachFuse(b); err != nil {
		return fmt.Errorf("detach storage faults %s: %w", id, err)
	}
	return nil
}

// detachFuse closes b's layer, if any, and removes what a layer leaves, also one a
// previous worker process left mounted. b.mu is held.
func (r *Runtime) detachFuse(b *box) error {
	var errs []error
	if b.fuse != nil {
		errs = append(errs, b.fuse.Close())
		b.fuse = nil
	}
	id := b.rec.Handle.ID
	for _, d := range []string{r.fuseDir(id), r.shadowDir(id)} {
		if err := unmount(d); err != nil {
			errs = append(errs, err)
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// beginFuse opens b's layer for one command and returns the workspace to bind and the
// function that closes the layer again once the command's processes are gone.
func (r *Runtime) beginFuse(b *box) (ws string, end func(), err error) {
	if b.fuse == nil {
		return r.workspace(b.rec), func() {}, nil
	}
	if err := b.fuse.Begin(); err != nil {
		return "", nil, err
	}
	l := b.fuse
	return r.fuseDir(b.rec.Handle.ID), func() {
		if err := l.End(); err != nil {
			r.cfg.Logger.Warn("sandbox: close storage fault layer", "sandbox", b.rec.Handle.ID, "err", err)
		}
	}, nil
}
