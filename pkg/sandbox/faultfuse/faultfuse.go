//go:build linux

// Package faultfuse is the filesystem layer that brings gauntlet's storage faults (B1, B2)
// to the commands a sandbox runs: a FUSE passthrough filesystem over the sandbox's real
// workspace directory, mounted where the runtime binds the workspace into the sandbox, so
// that every file operation of every process of a command (shell.exec) first passes the
// same faultfs.Gate the file tools use: same decision code, same ops, same stream keys
// ("fs/<path>", the path relative to the workspace), so a seed gives the same faults to the
// same operations whether the agent makes them with fs.write or with `echo x > f`.
//
// FUSE operations map onto storage events like this (the file tools make the same ones):
//
//	open, opendir                    open
//	create (open with O_CREAT of a   create, then open
//	  file that does not exist)
//	mknod, symlink, link             create (the new name)
//	mkdir                            mkdir
//	unlink, rmdir                    remove
//	rename                           rename (the old name)
//	read                             read   (each read(2): files are opened with direct I/O,
//	                                         so the page cache never hides one)
//	write                            write  (each write(2); short_write stores part and
//	                                         returns the count; ENOSPC when nothing is kept)
//	setlk (flock, fcntl locks)       lock   (lock_contention: a non-blocking lock fails with
//	                                         EWOULDBLOCK after wait_ms; a blocking one waits
//	                                         wait_ms, then gets the lock)
//
// Lookups, getattr, readdir, readlink, statfs, setattr (chmod, chown, utimes, truncate),
// fsync and release meet no fault: the kernel's caches decide how many of the first ones
// reach the filesystem, which would make faults depend on timing, and the catalogue has
// no op for the others. Copy_file_range and O_TMPFILE are refused (EOPNOTSUPP), so
// programs fall back to reads and writes, which are gated.
//
// Delays (io_latency, iops_cap, lock_contention's wait) are spent for real, on the wall
// clock, inside the FUSE operation: the process waiting on the syscall is the one slowed.
// A kill interrupts the wait.
//
// Safety: the FUSE server runs as root in the host's mount namespace, so it never
// resolves a path the sandbox could redirect: it reaches the workspace through a private
// bind mount with MS_NOSYMFOLLOW (a symlink planted by the sandbox is never followed by
// the server, only by the sandbox's own kernel view through readlink), mounted only while
// a command runs (Begin/End), and files it creates are given to the calling process's
// host uid and gid. The mount is allow_other (the sandbox's processes run as another
// user, in a user namespace) with default_permissions, so the kernel checks permissions
// as it would on the real directory. The /dev/fuse descriptor is opened close-on-exec so
// no other command inherits it.
package faultfuse

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
)

// ErrClosed is returned by Begin after Close.
var ErrClosed = errors.New("faultfuse: layer closed")

// maxWrite is the largest FUSE read or write request (the kernel splits larger I/O).
const maxWrite = 128 << 10

// Config says where a Layer lives.
type Config struct {
	// Workspace is the host directory the layer passes through to. Required.
	Workspace string
	// Mountpoint is an existing empty directory where the faulted view is mounted; the
	// runtime binds it into the sandbox as its workspace. Required.
	Mountpoint string
	// Shadow is an existing empty directory, reachable by root only, where the layer
	// binds Workspace (no symlinks followed) while a command runs. Required.
	Shadow string
	// Gate decides every operation's faults. Required.
	Gate *faultfs.Gate
}

// Layer is a mounted faultfuse filesystem. Begin and End bracket each command; between
// them the layer serves its operations, outside them it refuses them (EIO) so that nothing
// can reach the workspace when no command runs. A Layer is safe for concurrent use.
type Layer struct {
	cfg    Config
	server *fuse.Server

	// mu: operations hold it shared while they touch the workspace; End takes it
	// exclusively to close the layer.
	mu     sync.RWMutex
	open   bool
	closed bool
	// handles counts open file handles, which hold descriptors under the shadow mount.
	handles atomic.Int64
}

// Mount mounts a Layer at cfg.Mountpoint. It needs root and /dev/fuse; errors say which
// step failed.
func Mount(cfg Config) (*Layer, error) {
	switch {
	case cfg.Workspace == "":
		return nil, errors.New("faultfuse: config: workspace: required")
	case cfg.Mountpoint == "":
		return nil, errors.New("faultfuse: config: mountpoint: required")
	case cfg.Shadow == "":
		return nil, errors.New("faultfuse: config: shadow: required")
	case cfg.Gate == nil:
		return nil, errors.New("faultfuse: config: gate: required")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(cfg.Workspace, &st); err != nil {
		return nil, fmt.Errorf("faultfuse: workspace: %w", err)
	}
	l := &Layer{cfg: cfg}
	root := &node{LoopbackNode: &gofs.LoopbackNode{RootData: &gofs.LoopbackRoot{Path: cfg.Shadow, Dev: st.Dev}}, l: l}
	root.RootData.RootNode = root
	zero := time.Duration(0)
	// No entry, attribute or negative caching: the host-side file tools change the
	// workspace behind the kernel's back between commands.
	opts := &gofs.Options{EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero}
	opts.MountOptions = fuse.MountOptions{
		FsName: "gauntlet-faultfuse", Name: "gauntlet", MaxWrite: maxWrite,
		EnableLocks: true, DisableXAttrs: true,
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("faultfuse: open /dev/fuse: %w", err)
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions,max_read=%d", fd, maxWrite)
	if err := unix.Mount("gauntlet-faultfuse", cfg.Mountpoint, "fuse.gauntlet", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("faultfuse: mount %s: %w", cfg.Mountpoint, err)
	}
	// The server takes the descriptor over ("/dev/fd/N" tells go-fuse it is mounted).
	srv, err := fuse.NewServer(gofs.NewNodeFS(root, opts), "/dev/fd/"+strconv.Itoa(fd), &opts.MountOptions)
	if err != nil {
		_ = unix.Unmount(cfg.Mountpoint, unix.MNT_DETACH)
		unix.Close(fd)
		return nil, fmt.Errorf("faultfuse: serve %s: %w", cfg.Mountpoint, err)
	}
	l.server = srv
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		_ = unix.Unmount(cfg.Mountpoint, unix.MNT_DETACH)
		return nil, fmt.Errorf("faultfuse: mount %s: %w", cfg.Mountpoint, err)
	}
	return l, nil
}

// Begin opens the layer for a command: it binds the workspace at the shadow directory
// (MS_NOSYMFOLLOW) and lets operations through.
func (l *Layer) Begin() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.open {
		return nil
	}
	if err := unix.Mount(l.cfg.Workspace, l.cfg.Shadow, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("faultfuse: bind workspace: %w", err)
	}
	if err := unix.Mount("", l.cfg.Shadow, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSYMFOLLOW|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = unix.Unmount(l.cfg.Shadow, unix.MNT_DETACH)
		return fmt.Errorf("faultfuse: bind workspace nosymfollow: %w", err)
	}
	l.open = true
	return nil
}

// End closes the layer after a command (whose processes are all gone): it waits, up to
// two seconds, for the kernel to release the command's open files, refuses further
// operations and unmounts the shadow bind, so the workspace can be remounted
// (snapshots, restores) without the layer holding it.
func (l *Layer) End() error {
	deadline := time.Now().Add(2 * time.Second)
	for l.handles.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.open {
		return nil
	}
	l.open = false
	if err := unix.Unmount(l.cfg.Shadow, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("faultfuse: unmount shadow: %w", err)
	}
	return nil
}

// Close ends the layer and unmounts it (lazily if still busy) and waits for its server.
func (l *Layer) Close() error {
	err := l.End()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	if uerr := unix.Unmount(l.cfg.Mountpoint, 0); uerr != nil {
		if uerr = unix.Unmount(l.cfg.Mountpoint, unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			return errors.Join(err, fmt.Errorf("faultfuse: unmount %s: %w", l.cfg.Mountpoint, uerr))
		}
	}
	done := make(chan struct{})
	go func() { l.server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		err = errors.Join(err, errors.New("faultfuse: server did not stop within 5s"))
	}
	return err
}

// enter admits an operation that touches the workspace; leave must follow when it is true.
func (l *Layer) enter() bool {
	l.mu.RLock()
	if !l.open {
		l.mu.RUnlock()
		return false
	}
	return true
}

func (l *Layer) leave() { l.mu.RUnlock() }

// gate passes one storage event; its error is the errno the operation fails with.
func (l *Layer) gate(ctx context.Context, op, name string) (faults.Decision, syscall.Errno) {
	dec, err := l.cfg.Gate.Before(ctx, op, name)
	if err == nil {
		return dec, 0
	}
	var pe *fs.PathError
	var en syscall.Errno
	switch {
	case errors.As(err, &pe) && errors.As(pe.Err, &en):
		return dec, en
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return dec, syscall.EINTR // the kernel interrupted the request (the caller was killed)
	default:
		return dec, syscall.EIO
	}
}

// node is a LoopbackNode whose operations pass the layer's gate first.
type node struct {
	*gofs.LoopbackNode
	l *Layer
}

var (
	_ gofs.NodeWrapChilder    = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeCopyFileRanger = (*node)(nil)
	_ gofs.NodeTmpfiler       = (*node)(nil)
	_ gofs.NodeLookuper       = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeReaddirer      = (*node)(nil)
	_ gofs.NodeReadlinker     = (*node)(nil)
	_ gofs.NodeStatfser       = (*node)(nil)
	_ gofs.NodeStatxer        = (*node)(nil)
)
