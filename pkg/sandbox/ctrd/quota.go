package ctrd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Disk quota.
//
// A sandbox's writable layer (the upper and work directories of its overlay snapshot:
// /workspace and everything else it writes) lives on a tmpfs of its own, of
// Limits.DiskBytes, mounted on the active snapshot's directory before the task is
// created. A write past the limit fails with ENOSPC inside the sandbox, and no sandbox
// can fill the daemon's root, which holds its metadata, the images and every other
// sandbox's layer. The pages are still charged to the writer's memory cgroup.
//
// The shim mounts the overlay in its own mount namespace, the daemon's (ctrdlocal gives
// the daemon one of its own), so the tmpfs is mounted there, from a thread that enters
// that namespace (the daemon is found as the peer of its socket). The runtime keeps an
// O_PATH descriptor of the tmpfs's root, through which it reads the free space after
// each command (the disk_full event) and copies the upper directory for a snapshot, and
// one of the namespace, where it unmounts the tmpfs once the task is deleted. A sandbox
// joins a shim group only when the group's shim started in the namespace its tmpfs was
// mounted in (shimgroup.go): a daemon restarted since runs in a new namespace.

// diskQuota is a sandbox's writable-layer tmpfs.
type diskQuota struct {
	ns   *os.File // the mount namespace it is mounted in
	root *os.File // O_PATH descriptor of the tmpfs's root (the snapshot's directory)
	dir  string   // the mount point, the snapshot's directory, as the namespace names it
}

// upper is the overlay's upper directory, as this process reaches it.
func (q *diskQuota) upper() string {
	return "/proc/self/fd/" + strconv.Itoa(int(q.root.Fd())) + "/fs"
}

// full reports whether the tmpfs has no block left for the sandbox.
func (q *diskQuota) full() bool {
	var st unix.Statfs_t
	return unix.Fstatfs(int(q.root.Fd()), &st) == nil && st.Bavail == 0
}

func (q *diskQuota) close() {
	_ = q.root.Close()
	_ = q.ns.Close()
}

// daemonMountNS opens the mount namespace of the process serving containerd's socket,
// where the shims it starts mount their tasks' root filesystems, and returns it with its
// inode number (which tells namespaces apart).
func (r *Runtime) daemonMountNS() (*os.File, uint64, error) {
	conn, err := net.Dial("unix", r.opts.Address)
	if err != nil {
		return nil, 0, fmt.Errorf("find containerd's process: %w", err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return nil, 0, fmt.Errorf("find containerd's process: %w", err)
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err = errors.Join(cerr, err); err != nil {
		return nil, 0, fmt.Errorf("find containerd's process: peer of %s: %w", r.opts.Address, err)
	}
	return openMountNS(int(cred.Pid))
}

// openMountNS opens the mount namespace of process pid.
func openMountNS(pid int) (*os.File, uint64, error) {
	p := "/proc/" + strconv.Itoa(pid) + "/ns/mnt"
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("open mount namespace %s: %w", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("open mount namespace %s: %w", p, err)
	}
	return os.NewFile(uintptr(fd), p), st.Ino, nil
}

// inMountNS runs fn in the mount namespace ns, on an OS thread of its own that leaves the
// process's filesystem context (unshare CLONE_FS) and is discarded afterwards (it is never
// unlocked, so it ends with its goroutine and nothing else ever runs in the namespace).
func inMountNS(ns *os.File, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("enter mount namespace: %w", err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// snapshotDir is the directory of an overlay snapshot whose upper directory is upper
// (the overlayfs snapshotter's layout: <dir>/fs and <dir>/work).
func snapshotDir(upper string) (string, error) {
	if filepath.Base(upper) != "fs" || !filepath.IsAbs(upper) {
		return "", fmt.Errorf("upper directory %s is not an overlayfs snapshotter's <snapshot>/fs", upper)
	}
	return filepath.Dir(upper), nil
}

// mountQuota mounts a tmpfs of size bytes on the snapshot directory of upper in the
// daemon's mount namespace, with fresh fs and work directories of the snapshotter's
// modes and owner, and returns it with the namespace's inode number.
func (r *Runtime) mountQuota(upper string, size int64) (*diskQuota, uint64, error) {
	dir, err := snapshotDir(upper)
	if err != nil {
		return nil, 0, fmt.Errorf("disk quota: %w", err)
	}
	ns, ino, err := r.daemonMountNS()
	if err != nil {
		return nil, 0, fmt.Errorf("disk quota: %w", err)
	}
	var root int
	err = inMountNS(ns, func() error {
		// The snapshotter made fs (and work) empty; their modes and owner are kept.
		var fsSt, workSt unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, "fs"), &fsSt); err != nil {
			return err
		}
		if err := unix.Lstat(filepath.Join(dir, "work"), &workSt); err != nil {
			return err
		}
		inodes := max(size/4096, 16384)
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, inodes)
		if err := unix.Mount("gauntlet-disk", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
		}
		ok := false
		defer func() {
			if !ok {
				_ = unix.Unmount(dir, unix.MNT_DETACH)
			}
		}()
		for _, d := range []struct {
			name string
			st   *unix.Stat_t
		}{{"fs", &fsSt}, {"work", &workSt}} {
			p := filepath.Join(dir, d.name)
			if err := unix.Mkdir(p, d.st.Mode&0o7777); err != nil {
				return err
			}
			if err := unix.Chmod(p, d.st.Mode&0o7777); err != nil {
				return err
			}
			if err := unix.Lchown(p, int(d.st.Uid), int(d.st.Gid)); err != nil {
				return err
			}
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		root, ok = fd, true
		return nil
	})
	if err != nil {
		ns.Close()
		return nil, 0, fmt.Errorf("disk quota: %w", err)
	}
	return &diskQuota{ns: ns, root: os.NewFile(uintptr(root), dir), dir: dir}, ino, nil
}

// findQuota finds the tmpfs an earlier runtime mounted for the active snapshot key: in
// the mount namespace of the shim that runs the sandbox's task (the parent of its init,
// taskPid, when it still runs), else in the daemon's; nil when there is none (a sandbox
// made before the runtime had quotas).
func (r *Runtime) findQuota(ctx context.Context, key string, taskPid int) *diskQuota {
	if key == "" {
		return nil
	}
	ms, err := r.c.SnapshotService(r.opts.Snapshotter).Mounts(ctx, key)
	if err != nil {
		return nil
	}
	upper, err := upperDir(ms)
	if err != nil {
		return nil
	}
	dir, err := snapshotDir(upper)
	if err != nil {
		return nil
	}
	var spaces []func() (*os.File, uint64, error)
	if shim := parentPid(taskPid); taskPid > 0 && shim > 0 {
		spaces = append(spaces, func() (*os.File, uint64, error) { return openMountNS(shim) })
	}
	spaces = append(spaces, r.daemonMountNS)
	for _, openNS := range spaces {
		ns, _, err := openNS()
		if err != nil {
			continue
		}
		if q := quotaIn(ns, dir); q != nil {
			return q
		}
		ns.Close()
	}
	return nil
}

// quotaIn returns the tmpfs mounted on dir in the mount namespace ns, or nil when dir is
// not a tmpfs mount point there. It keeps ns open in what it returns.
func quotaIn(ns *os.File, dir string) *diskQuota {
	var root int
	err := inMountNS(ns, func() error {
		var in, above unix.Stat_t
		if err := unix.Stat(dir, &in); err != nil {
			return err
		}
		if err := unix.Stat(filepath.Dir(dir), &above); err != nil {
			return err
		}
		var sfs unix.Statfs_t
		if err := unix.Statfs(dir, &sfs); err != nil {
			return err
		}
		if in.Dev == above.Dev || sfs.Type != unix.TMPFS_MAGIC {
			return errors.New("not a mount point")
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		root = fd
		return err
	})
	if err != nil {
		return nil
	}
	return &diskQuota{ns: ns, root: os.NewFile(uintptr(root), dir), dir: dir}
}

// unmount detaches the tmpfs in its namespace (the task that used it is deleted) and
// closes q's descriptors, which frees the tmpfs's memory.
func (q *diskQuota) unmount() error {
	err := inMountNS(q.ns, func() error {
		if err := unix.Unmount(q.dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount the disk quota tmpfs %s: %w", q.dir, err)
		}
		return nil
	})
	q.close()
	return err
}

// parentPid is pid's parent process id, or 0.
func parentPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	st := string(b)
	i := strings.LastIndexByte(st, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(st[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
