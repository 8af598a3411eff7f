package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// resolve is how every host-side lookup resolves a path below the workspace root: never
// above it, never through a symlink or a /proc magic link.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// hostFS reaches the workspace through the runtime's host directory.
type hostFS struct {
	rt sandbox.Runtime
	wd sandbox.WorkspaceDirer
	id string
}

// root opens the workspace root. It is opened per call: a restore remounts the workspace,
// and an fd kept across it would see the old mount.
func (h *hostFS) root(ctx context.Context) (int, error) {
	dir, err := h.wd.WorkspaceDir(ctx, h.id)
	if errors.Is(err, sandbox.ErrWorkspaceReplaced) {
		return -1, fmt.Errorf("%w: %w", ErrSymlink, err) // the sandbox's doing: refused, reported
	}
	if err != nil {
		return -1, err
	}
	// O_NOFOLLOW: a runtime's workspace path may cross into the sandbox's root
	// (/proc/PID/root/workspace), where the sandbox can swap the folder for a link.
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, fmt.Errorf("open workspace: %w: %w", ErrSymlink, sandbox.ErrWorkspaceReplaced)
	}
	if err != nil {
		return -1, fmt.Errorf("open workspace: %w", err)
	}
	return fd, nil
}

// openat2 opens rel below dirfd and maps resolution errors to the tools' errors.
func openat2(dirfd int, rel string, flags uint64, mode uint64) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Mode: mode, Resolve: resolve})
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			continue
		case errors.Is(err, unix.ELOOP):
			return -1, ErrSymlink
		case errors.Is(err, unix.EXDEV):
			return -1, ErrOutside
		case errors.Is(err, unix.ENOENT):
			return -1, ErrNotExist
		case errors.Is(err, unix.ENOTDIR):
			return -1, ErrNotDir
		case errors.Is(err, unix.EISDIR):
			return -1, ErrIsDir
		case errors.Is(err, unix.ENOSYS):
			return -1, fmt.Errorf("%w: openat2 needs Linux 5.6+", sandbox.ErrUnavailable)
		default:
			return -1, err
		}
	}
}

// statAt looks rel up without opening it for I/O (O_PATH opens nothing: no device
// driver, no FIFO blocking).
func statAt(dirfd int, rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := openat2(dirfd, rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return st, err
	}
	return st, nil
}

func kind(st unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "other"
}

// regular checks that rel is a regular file before it is opened for I/O.
func regular(dirfd int, rel string) (unix.Stat_t, error) {
	st, err := statAt(dirfd, rel)
	if err != nil {
		return st, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return st, nil
	case unix.S_IFDIR:
		return st, ErrIsDir
	case unix.S_IFLNK:
		return st, ErrSymlink
	default:
		return st, fmt.Errorf("%w: it is a %s", ErrSpecialFile, kind(st))
	}
}

// sameFile guards the window between the O_PATH check and the real open.
func sameFile(fd int, want unix.Stat_t) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Dev != want.Dev || st.Ino != want.Ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: the file changed while it was opened", ErrSpecialFile)
	}
	return nil
}

func (h *hostFS) read(ctx context.Context, rel string, max int64) ([]byte, error) {
	root, err := h.root(ctx)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	st, err := regular(root, rel)
	if err != nil {
		return nil, err
	}
	if st.Size > max {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, st.Size, max)
	}
	fd, err := openat2(root, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := sameFile(fd, st); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
	}
	return b, nil
}

func (h *hostFS) owner(ctx context.Context) (uid, gid int, ok bool, err error) {
	wo, is := h.rt.(sandbox.WorkspaceOwner)
	if !is {
		return 0, 0, false, nil
	}
	uid, gid, err = wo.WorkspaceOwner(ctx, h.id)
	return uid, gid, err == nil, err
}

func (h *hostFS) write(ctx context.Context, rel string, data []byte, mode uint32) error {
	root, err := h.root(ctx)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	uid, gid, chown, err := h.owner(ctx)
	if err != nil {
		return err
	}
	// Walk the parents, creating missing directories one component at a time.
	dir, base := path.Split(rel)
	dirfd, err := unix.Dup(root)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dirfd) }()
	for _, c := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
		if c == "" {
			continue
		}
		// Without O_NOFOLLOW, RESOLVE_NO_SYMLINKS refuses a symlink here with ELOOP.
		next, err := openat2(dirfd, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		if errors.Is(err, ErrNotExist) {
			if err := unix.Mkdirat(dirfd, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("mkdir %s: %w", c, err)
			}
			if chown {
				if err := unix.Fchownat(dirfd, c, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return err
				}
			}
			next, err = openat2(dirfd, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		}
		if err != nil {
			return err
		}
		unix.Close(dirfd)
		dirfd = next
	}
	created := false
	st, err := regular(dirfd, base)
	switch {
	case errors.Is(err, ErrNotExist):
		created = true
	case err != nil:
		return err
	}
	flags := uint64(unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK)
	if created {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	var perm uint64
	if created {
		perm = uint64(mode)
	}
	fd, err := openat2(dirfd, base, flags, perm)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if !created {
		if err := sameFile(fd, st); err != nil {
			return err
		}
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	if created && chown {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return err
		}
	}
	return f.Close()
}

func (h *hostFS) list(ctx context.Context, rel string) ([]Entry, error) {
	root, err := h.root(ctx)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	st, err := statAt(root, rel)
	if err != nil {
		return nil, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return nil, ErrSymlink
	default:
		return nil, ErrNotDir
	}
	fd, err := openat2(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		var est unix.Stat_t
		if err := unix.Fstatat(fd, n, &est, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		k := kind(est)
		if k != "file" && k != "dir" && k != "symlink" {
			k = "other"
		}
		out = append(out, Entry{Name: n, Type: k, Size: est.Size, Mode: est.Mode & 0o7777})
	}
	return out, nil
}
