package ctrd

import (
	"context"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/faultfuse"
)

// Storage faults for commands: AttachStorageFaults sets up a faultfuse layer for
// the sandbox; while it is attached, every exec mounts it over /workspace inside the
// container's mount namespace for the span of the command, so each file operation of the
// command's processes passes the gate. The workspace is a directory of the container's
// rootfs, which is mounted in the container's namespace only, so the layer's source is a
// detached clone of that directory (open_tree, made from inside the namespace, where the
// FUSE mount does not hide it) with MOUNT_ATTR_NOSYMFOLLOW, reached by the server as
// /proc/self/fd/N and closed when the command ends. The host-side file tools reach the
// workspace through /proc/PID/root between commands, where nothing is mounted.

var _ sandbox.StorageFaulter = (*Runtime)(nil)

// AttachStorageFaults implements sandbox.StorageFaulter.
func (r *Runtime) AttachStorageFaults(ctx context.Context, id string, gate *faultfs.Gate) error {
	if gate == nil {
		return fmt.Errorf("attach storage faults %s: %w: gate: required", id, sandbox.ErrInvalid)
	}
	b, err := r.get("attach storage faults", id)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone {
		return fmt.Errorf("attach storage faults %s: %w", id, sandbox.ErrNotFound)
	}
	if err := b.detachFuse(); err != nil {
		return fmt.Errorf("attach storage faults %s: %w", id, err)
	}
	enter := faultfuse.InMountNamespace(func() (int, error) {
		if b.task == nil {
			return 0, fmt.Errorf("%w: no running task", sandbox.ErrNotFound)
		}
		return int(b.task.Pid()), nil
	})
	l, err := faultfuse.Open(faultfuse.Config{
		Mountpoint: sandbox.WorkspacePath, Enter: enter, Gate: gate,
		Source: func() (string, func() error, error) { return workspaceClone(enter) },
	})
	if err != nil {
		return fmt.Errorf("attach storage faults %s: %w: %v", id, sandbox.ErrUnavailable, err)
	}
	b.fuse = l
	return nil
}

// DetachStorageFaults implements sandbox.StorageFaulter.
func (r *Runtime) DetachStorageFaults(ctx context.Context, id string) error {
	b, err := r.get("detach storage faults", id)
	if err != nil {
		return err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if err := b.detachFuse(); err != nil {
		return fmt.Errorf("detach storage faults %s: %w", id, err)
	}
	return nil
}

// detachFuse closes b's layer, if any. b.op is held.
func (b *box) detachFuse() error {
	if b.fuse == nil {
		return nil
	}
	err := b.fuse.Close()
	b.fuse = nil
	return err
}

// workspaceClone makes, from inside the container's mount namespace, a detached clone of
// its /workspace that follows no symlink, and returns it as a path the server can use.
func workspaceClone(enter func(func() error) error) (string, func() error, error) {
	fd := -1
	err := enter(func() error {
		var err error
		fd, err = unix.OpenTree(unix.AT_FDCWD, sandbox.WorkspacePath, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("clone %s: %w", sandbox.WorkspacePath, err)
		}
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSYMFOLLOW | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			return fmt.Errorf("clone %s: nosymfollow: %w", sandbox.WorkspacePath, err)
		}
		return nil
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return "", nil, err
	}
	return "/proc/self/fd/" + strconv.Itoa(fd), func() error { return unix.Close(fd) }, nil
}
