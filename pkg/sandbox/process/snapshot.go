//go:build linux

package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Snapshot implements sandbox.Snapshotter. When the workspace changed since its layers
// were last frozen, the upper layer becomes a new read-only layer (a rename, no copy) and
// the overlay is remounted over it with a fresh upper layer; otherwise the snapshot shares
// the current layers and nothing is remounted.
func (r *Runtime) Snapshot(ctx context.Context, id string) (sandbox.Snapshot, error) {
	b, err := r.lock("snapshot", id)
	if err != nil {
		return sandbox.Snapshot{}, err
	}
	defer b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	rec := b.rec
	upper := filepath.Join(r.volDir(rec.Volume), "upper")
	ents, err := os.ReadDir(upper)
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	chain := rec.Chain
	if len(ents) > 0 {
		if err := b.cg.kill(5 * time.Second); err != nil {
			return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
		}
		if err := unmount(r.workspace(rec)); err != nil {
			return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
		}
		layer := filepath.Join("vol", rec.Volume, "l-"+newID())
		// Between the rename and the new chain the layer is referenced by nothing: keep
		// gc out.
		r.layerMu.Lock()
		if err := os.Rename(upper, r.path(layer)); err != nil {
			r.layerMu.Unlock()
			return sandbox.Snapshot{}, r.remountAfterFailure(rec, fmt.Errorf("snapshot %s: freeze layer: %w", id, err))
		}
		chain = append([]string{layer}, rec.Chain...)
		old := rec.Chain
		r.setChain(rec, chain)
		r.layerMu.Unlock()
		if err := r.mountWorkspace(rec); err != nil {
			// Put the layer back as the upper dir so nothing is lost.
			r.setChain(rec, old)
			_ = os.Rename(r.path(layer), upper)
			return sandbox.Snapshot{}, r.remountAfterFailure(rec, fmt.Errorf("snapshot %s: %w", id, err))
		}
		if err := r.save("sandboxes", id, rec); err != nil {
			return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
		}
	}
	snap := &snapRecord{
		Snapshot: sandbox.Snapshot{ID: "snap-" + newID(), Sandbox: id, Created: time.Now().UTC()},
		Spec:     rec.Handle.Spec,
		Chain:    slices.Clone(chain),
	}
	r.mu.Lock()
	r.putSnapshot(snap.Snapshot.ID, snap)
	r.mu.Unlock()
	if err := r.save("snapshots", snap.Snapshot.ID, snap); err != nil {
		r.mu.Lock()
		r.dropSnapshot(snap.Snapshot.ID)
		r.mu.Unlock()
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return snap.Snapshot, nil
}

// remountAfterFailure tries to leave the workspace mounted over rec.Chain after a failed
// operation, and returns err.
func (r *Runtime) remountAfterFailure(rec *boxRecord, err error) error {
	if mErr := r.mountWorkspaceKeepUpper(rec); mErr != nil {
		return errors.Join(err, fmt.Errorf("remount: %w", mErr))
	}
	return err
}

// mountWorkspaceKeepUpper mounts the overlay over rec.Chain keeping the upper dir's
// content (it clears only the work dir).
func (r *Runtime) mountWorkspaceKeepUpper(rec *boxRecord) error {
	vd := r.volDir(rec.Volume)
	if err := os.MkdirAll(filepath.Join(vd, "upper"), 0o755); err != nil {
		return err
	}
	work := filepath.Join(vd, "work")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.Mkdir(work, 0o755); err != nil {
		return err
	}
	return r.mountOverlay(rec)
}

// Restore implements sandbox.Snapshotter: the workspace becomes the snapshot's layers
// under a fresh, empty upper layer.
func (r *Runtime) Restore(ctx context.Context, id, snapshotID string) error {
	b, err := r.lock("restore", id)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("restore %s: %w", id, err)
	}
	// From the lookup until the sandbox's chain names the snapshot's layers, a concurrent
	// DeleteSnapshot's gc must not remove them.
	r.layerMu.Lock()
	r.mu.Lock()
	snap, ok := r.snapshots[snapshotID]
	r.mu.Unlock()
	if !ok {
		r.layerMu.Unlock()
		return fmt.Errorf("restore %s from %s: %w", id, snapshotID, sandbox.ErrNotFound)
	}
	if err := b.cg.kill(5 * time.Second); err != nil {
		r.layerMu.Unlock()
		return fmt.Errorf("restore %s: %w", id, err)
	}
	if err := unmount(r.workspace(b.rec)); err != nil {
		r.layerMu.Unlock()
		return fmt.Errorf("restore %s: %w", id, err)
	}
	old := b.rec.Chain
	r.setChain(b.rec, slices.Clone(snap.Chain))
	r.layerMu.Unlock()
	if err := r.mountWorkspace(b.rec); err != nil {
		r.setChain(b.rec, old)
		return r.remountAfterFailure(b.rec, fmt.Errorf("restore %s: %w", id, err))
	}
	if err := r.save("sandboxes", id, b.rec); err != nil {
		return fmt.Errorf("restore %s: %w", id, err)
	}
	if !slices.Equal(old, b.rec.Chain) {
		r.gc(false, volumes("", old)...)
	}
	return nil
}

// DeleteSnapshot implements sandbox.Snapshotter. Layers stay while a sandbox or another
// snapshot uses them.
func (r *Runtime) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("delete snapshot %s: %w", snapshotID, sandbox.ErrClosed)
	}
	snap, ok := r.dropSnapshot(snapshotID)
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("delete snapshot %s: %w", snapshotID, sandbox.ErrNotFound)
	}
	if err := os.Remove(r.path("snapshots", snapshotID+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete snapshot %s: %w", snapshotID, err)
	}
	r.gc(false, volumes("", snap.Chain)...)
	return nil
}

// ListSnapshots implements sandbox.SnapshotLister: every snapshot record in the state
// directory, those of earlier runtime instances included, oldest first.
func (r *Runtime) ListSnapshots(ctx context.Context) ([]sandbox.Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("list snapshots: %w", sandbox.ErrClosed)
	}
	out := make([]sandbox.Snapshot, 0, len(r.snapshots))
	for _, s := range r.snapshots {
		out = append(out, s.Snapshot)
	}
	slices.SortFunc(out, func(a, b sandbox.Snapshot) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Fork implements sandbox.Forker: a new sandbox over the snapshot's layers, with the
// source's spec (a new id, no seeding: the snapshot already holds the workspace).
func (r *Runtime) Fork(ctx context.Context, snapshotID string) (sandbox.Handle, error) {
	return r.fork(ctx, snapshotID, nil)
}

var _ sandbox.UserForker = (*Runtime)(nil)

// ForkAs implements sandbox.UserForker: the fork's commands run as user, resolved
// against the snapshot's root (the image's /etc/passwd).
func (r *Runtime) ForkAs(ctx context.Context, snapshotID, user string) (sandbox.Handle, error) {
	return r.fork(ctx, snapshotID, &user)
}

// fork is Fork, with Spec.User replaced when user is not nil.
func (r *Runtime) fork(ctx context.Context, snapshotID string, user *string) (sandbox.Handle, error) {
	r.mu.Lock()
	snap, ok := r.snapshots[snapshotID]
	r.mu.Unlock()
	if !ok {
		return sandbox.Handle{}, fmt.Errorf("fork %s: %w", snapshotID, sandbox.ErrNotFound)
	}
	spec := snap.Spec
	spec.ID = ""
	if user != nil {
		spec.User = *user
		if err := spec.Validate(); err != nil {
			return sandbox.Handle{}, fmt.Errorf("fork %s: %w", snapshotID, err)
		}
	}
	h, err := r.create(ctx, spec, snap.Chain, snapshotID, false)
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("fork %s: %w", snapshotID, err)
	}
	return h, nil
}

// Purge destroys every sandbox and deletes every snapshot under the state directory,
// including those of earlier runtime instances (operators' cleanup; tests' teardown), and
// removes the runtime's now empty cgroup and mount-point directories (made again on the
// next Create).
func (r *Runtime) Purge(ctx context.Context) error {
	r.mu.Lock()
	var ids, snaps []string
	for id, rec := range r.known {
		if !rec.Handle.Created.IsZero() {
			ids = append(ids, id)
		}
	}
	for id := range r.snapshots {
		snaps = append(snaps, id)
	}
	r.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := r.Destroy(ctx, id); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	for _, id := range snaps {
		if err := r.DeleteSnapshot(ctx, id); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	r.gc(true) // what failures or dead processes left
	r.mu.Lock()
	r.dropCgPool()
	r.mu.Unlock()
	r.waitTrim() // for the removal it may have under way
	r.mu.Lock()
	r.removeEmptyParents() // now empty
	r.mu.Unlock()
	return errors.Join(errs...)
}
