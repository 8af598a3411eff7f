package ctrd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Snapshot implements sandbox.Snapshotter (see the package doc for how).
func (r *Runtime) Snapshot(ctx context.Context, id string) (sandbox.Snapshot, error) {
	b, err := r.get("snapshot", id)
	if err != nil {
		return sandbox.Snapshot{}, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone || b.task == nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, sandbox.ErrNotFound)
	}
	if b.st.Chain+1 > MaxChain {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w: %v: %d snapshots deep (MaxChain %d); fork from an earlier one", id, sandbox.ErrLimit, errChainTooLong, b.st.Chain, MaxChain)
	}
	ctx = r.ctx(ctx)
	sid := "snap-" + randomID()
	name := r.snapName(sid)
	meta := snapMeta{
		Snapshot: sandbox.Snapshot{ID: sid, Sandbox: id},
		Name:     name,
		Chain:    b.st.Chain + 1,
		Spec:     b.handle.Spec,
	}
	meta.Spec.ID = ""
	meta.Spec.Workspace = nil // the snapshot holds the workspace

	lease, err := r.c.LeasesService().Create(ctx, leases.WithID(r.leaseID(sid)), leases.WithLabels(map[string]string{labelState: r.key, labelSandbox: id}))
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: lease: %w", id, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = r.c.LeasesService().Delete(context.WithoutCancel(ctx), lease)
		}
	}()
	lctx := leases.WithLease(ctx, lease.ID)
	sn := r.c.SnapshotService(r.opts.Snapshotter)
	srcMounts, err := sn.Mounts(ctx, b.st.SnapshotKey)
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: mounts of %s: %w", id, b.st.SnapshotKey, err)
	}
	src, err := upperDir(srcMounts)
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if b.quota != nil {
		src = b.quota.upper() // the daemon's namespace mounts it there, not this one
	}
	tmpKey := name + "-copy"
	dstMounts, err := sn.Prepare(lctx, tmpKey, b.st.Parent)
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: prepare: %w", id, err)
	}
	dst, err := upperDir(dstMounts)
	if err != nil {
		_ = sn.Remove(ctx, tmpKey)
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	// Frozen while copying, so background processes cannot tear the copy.
	if err := b.task.Pause(ctx); err != nil {
		_ = sn.Remove(ctx, tmpKey)
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: pause: %w", id, err)
	}
	copyErr := copyTree(src, dst, snapshotKeeps(b.handle.Spec))
	if err := b.task.Resume(context.WithoutCancel(ctx)); err != nil {
		r.log.Warn("resume after snapshot", "sandbox", id, "err", err)
	}
	if copyErr != nil {
		_ = sn.Remove(ctx, tmpKey)
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: copy workspace: %w", id, copyErr)
	}
	if err := sn.Commit(lctx, name, tmpKey, snapshots.WithLabels(map[string]string{labelState: r.key})); err != nil {
		_ = sn.Remove(ctx, tmpKey)
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: commit: %w", id, err)
	}
	meta.Snapshot.Created = time.Now().UTC()
	data, err := json.Marshal(meta)
	if err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := os.WriteFile(r.snapPath(sid), data, 0o600); err != nil {
		return sandbox.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	ok = true
	return meta.Snapshot, nil
}

// loadSnap reads a snapshot's metadata; ErrNotFound when it does not exist.
func (r *Runtime) loadSnap(op, sid string) (snapMeta, error) {
	var m snapMeta
	if !sandbox.ValidID(sid) {
		return m, fmt.Errorf("%s: snapshot %q: %w", op, sid, sandbox.ErrNotFound)
	}
	data, err := os.ReadFile(r.snapPath(sid))
	if errors.Is(err, fs.ErrNotExist) {
		return m, fmt.Errorf("%s: snapshot %s: %w", op, sid, sandbox.ErrNotFound)
	}
	if err != nil {
		return m, fmt.Errorf("%s: snapshot %s: %w", op, sid, err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("%s: snapshot %s: decode: %w", op, sid, err)
	}
	return m, nil
}

// Restore implements sandbox.Snapshotter: the sandbox's container is replaced by one
// with the same id and spec whose rootfs sits on the snapshot.
func (r *Runtime) Restore(ctx context.Context, id, snapshotID string) error {
	b, err := r.get("restore", id)
	if err != nil {
		return err
	}
	m, err := r.loadSnap("restore "+id, snapshotID)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone {
		return fmt.Errorf("restore %s: %w", id, sandbox.ErrNotFound)
	}
	ctx = r.ctx(ctx)
	// Hold the snapshot while the old container goes and the new one comes.
	lctx, done, err := r.c.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(10*time.Minute))
	if err != nil {
		return fmt.Errorf("restore %s: lease: %w", id, err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	if err := r.c.LeasesService().AddResource(lctx, leases.Lease{ID: mustLease(lctx)}, leases.Resource{ID: m.Name, Type: "snapshots/" + r.opts.Snapshotter}); err != nil {
		if errdefs.IsNotFound(err) {
			return fmt.Errorf("restore %s: snapshot %s: %w", id, snapshotID, sandbox.ErrNotFound)
		}
		return fmt.Errorf("restore %s: hold snapshot: %w", id, err)
	}
	r.teardown(ctx, b)
	b.st = boxState{Parent: m.Name, Chain: m.Chain}
	if err := r.start(lctx, b); err != nil {
		// The sandbox has no container any more: it is gone.
		b.gone = true
		r.mu.Lock()
		delete(r.boxes, id)
		r.mu.Unlock()
		_ = os.RemoveAll(r.sandboxDir(id))
		return fmt.Errorf("restore %s: %w", id, err)
	}
	return r.saveHandle(b)
}

func mustLease(ctx context.Context) string {
	id, _ := leases.FromContext(ctx)
	return id
}

// Fork implements sandbox.Forker: a new sandbox with the source's spec whose rootfs
// sits on the snapshot.
func (r *Runtime) Fork(ctx context.Context, snapshotID string) (sandbox.Handle, error) {
	return r.fork(ctx, snapshotID, nil)
}

// ForkAs implements sandbox.UserForker: the fork's agent, and so its commands, run as
// user, resolved against the snapshot's root.
func (r *Runtime) ForkAs(ctx context.Context, snapshotID, user string) (sandbox.Handle, error) {
	return r.fork(ctx, snapshotID, &user)
}

// fork is Fork, with Spec.User replaced when user is not nil.
func (r *Runtime) fork(ctx context.Context, snapshotID string, user *string) (sandbox.Handle, error) {
	if r.isClosed() {
		return sandbox.Handle{}, fmt.Errorf("fork %s: %w", snapshotID, sandbox.ErrClosed)
	}
	m, err := r.loadSnap("fork", snapshotID)
	if err != nil {
		return sandbox.Handle{}, err
	}
	ctx = r.ctx(ctx)
	lctx, done, err := r.c.WithLease(ctx, leases.WithRandomID(), leases.WithExpiration(10*time.Minute))
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("fork %s: lease: %w", snapshotID, err)
	}
	defer func() { _ = done(context.WithoutCancel(ctx)) }()
	spec := m.Spec
	if user != nil {
		spec.User = *user
		if err := spec.Validate(); err != nil {
			return sandbox.Handle{}, fmt.Errorf("fork %s: %w", snapshotID, err)
		}
	}
	h, err := r.create(lctx, spec, m.Name, m.Chain)
	if err != nil {
		return sandbox.Handle{}, fmt.Errorf("fork %s: %w", snapshotID, err)
	}
	if user != nil {
		if err := r.handOver(h.ID); err != nil {
			return sandbox.Handle{}, errors.Join(fmt.Errorf("fork %s as %q: %w", snapshotID, *user, err), r.Destroy(context.WithoutCancel(ctx), h.ID))
		}
	}
	return h, nil
}

// handOver gives a fork that runs as another user than its source the workspace folder
// and its links' folders the source's user owned (the runtime gave them to it, or its
// commands made them): the fork's user, root without capabilities included, may then
// clear and write them (a verifier's /logs/verifier, /tests) as the source's could.
// What lies below them keeps its owner, as what the image owned does.
func (r *Runtime) handOver(id string) error {
	b, err := r.get("hand over", id)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	root, err := os.OpenRoot(fmt.Sprintf("/proc/%d/root", b.task.Pid()))
	if err != nil {
		return fmt.Errorf("open the sandbox's root: %w", err)
	}
	defer root.Close()
	ws := strings.TrimPrefix(sandbox.WorkspacePath, "/")
	fi, err := root.Lstat(ws)
	if err != nil {
		return fmt.Errorf("%s: %w", sandbox.WorkspacePath, err)
	}
	from, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || (from.Uid == b.user.UID && from.Gid == b.user.GID) {
		return nil
	}
	names := []string{ws}
	for _, l := range slices.Sorted(maps.Keys(b.handle.Spec.Links)) {
		rel, _ := sandbox.CleanRelPath(b.handle.Spec.Links[l]) // validated
		names = append(names, path.Join(ws, rel))
	}
	for _, name := range names {
		fi, err := root.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || !ok || st.Uid != from.Uid || st.Gid != from.Gid {
			continue
		}
		if err := root.Lchown(name, int(b.user.UID), int(b.user.GID)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// DeleteSnapshot implements sandbox.Snapshotter.
func (r *Runtime) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if r.isClosed() {
		return fmt.Errorf("delete snapshot %s: %w", snapshotID, sandbox.ErrClosed)
	}
	if _, err := r.loadSnap("delete", snapshotID); err != nil {
		return err
	}
	ctx = r.ctx(ctx)
	if err := r.c.LeasesService().Delete(ctx, leases.Lease{ID: r.leaseID(snapshotID)}); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete snapshot %s: %w", snapshotID, err)
	}
	if err := os.Remove(r.snapPath(snapshotID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete snapshot %s: %w", snapshotID, err)
	}
	return nil
}

// ListSnapshots implements sandbox.SnapshotLister: every snapshot record in the state
// directory, those of earlier runtime instances included, oldest first. A record that
// cannot be read is logged and left out.
func (r *Runtime) ListSnapshots(ctx context.Context) ([]sandbox.Snapshot, error) {
	if r.isClosed() {
		return nil, fmt.Errorf("list snapshots: %w", sandbox.ErrClosed)
	}
	es, err := os.ReadDir(filepath.Join(r.opts.StateDir, "snapshots"))
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []sandbox.Snapshot
	for _, e := range es {
		sid, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !sandbox.ValidID(sid) {
			continue
		}
		m, err := r.loadSnap("list snapshots", sid)
		if err != nil {
			r.log.Warn("snapshot without a readable record", "snapshot", sid, "err", err)
			continue
		}
		out = append(out, m.Snapshot)
	}
	slices.SortFunc(out, func(a, b sandbox.Snapshot) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// upperDir finds the writable directory of an active overlay snapshot's mount.
func upperDir(ms []mount.Mount) (string, error) {
	for _, m := range ms {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return v, nil
			}
		}
	}
	if len(ms) == 1 && ms[0].Type == "bind" {
		// A snapshot straight on an empty parent is a plain bind of its directory.
		return ms[0].Source, nil
	}
	return "", fmt.Errorf("snapshot mount has no overlay upperdir (snapshotter must be overlay-based): %+v", ms)
}

// copyTree copies an overlay upper directory: regular files, directories, symlinks,
// whiteouts (0/0 character devices) and the trusted.overlay.* attributes that mark
// opaque directories, with owners, modes and times. keep, when not nil, says which
// top-level entries to copy.
func copyTree(src, dst string, keep func(top string) bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if keep != nil && rel != "." && !strings.Contains(rel, string(filepath.Separator)) && !keep(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := info.Sys().(*syscall.Stat_t)
		switch {
		case d.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, info.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
					return err
				}
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case d.Type()&fs.ModeCharDevice != 0 && st != nil:
			if err := unix.Mknod(target, uint32(st.Mode), int(st.Rdev)); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(p, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			// Sockets and fifos are not part of a workspace snapshot.
			return nil
		}
		if st != nil {
			if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
			if d.Type()&fs.ModeSymlink == 0 {
				if err := os.Chmod(target, info.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
					return err
				}
			}
			ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		return copyXattrs(p, target)
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil { // copy_file_range inside the kernel
		out.Close()
		return err
	}
	return out.Close()
}

// copyXattrs copies the overlay's own attributes (opaque directories, redirects).
func copyXattrs(src, dst string) error {
	buf := make([]byte, 1024)
	n, err := unix.Llistxattr(src, buf)
	if err != nil || n == 0 {
		return nil
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !strings.HasPrefix(name, "trusted.overlay.") && !strings.HasPrefix(name, "user.overlay.") {
			continue
		}
		val := make([]byte, 256)
		m, err := unix.Lgetxattr(src, name, val)
		if err != nil {
			continue
		}
		if err := unix.Lsetxattr(dst, name, val[:m], 0); err != nil {
			return fmt.Errorf("copy attribute %s of %s: %w", name, src, err)
		}
	}
	return nil
}
