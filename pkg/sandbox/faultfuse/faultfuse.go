//go:build linux

// Package faultfuse is the filesystem layer that brings gauntlet's storage faults
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
// clock, inside the FUSE operation: the process waiting on the syscall is the one slowed,
// as by a slow disk, uninterruptibly (a signal does not cut the delay short; a kill ends
// the process's wait, and End the delay).
//
// A layer is mounted for one command at a time (Begin, End): within a command every
// change goes through it, so the kernel may cache entries and attributes for the whole
// command; between commands the host-side file tools change the workspace directly and
// nothing is mounted.
//
// Safety: the FUSE server runs as root in the host's mount namespace, so it never
// resolves a path the sandbox could redirect: it reaches the workspace through a mount
// that follows no symlink (a private bind with MS_NOSYMFOLLOW, or the Config.Source a
// runtime gives, such as a detached nosymfollow clone of a container's /workspace): a
// symlink planted by the sandbox is never followed by the server, only by the sandbox's
// own kernel view through readlink. That mount exists only while a command runs, and
// files the server creates are given to the calling process's host uid and gid. The mount is allow_other (the sandbox's processes run as another
// user, in a user namespace) with default_permissions, so the kernel checks permissions
// as it would on the real directory. The /dev/fuse descriptor is opened close-on-exec so
// no other command inherits it.
package faultfuse

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/procfs"
)

// ErrClosed is returned by Begin after Close.
var ErrClosed = errors.New("faultfuse: layer closed")

// maxWrite is the largest FUSE read or write request (the kernel splits larger I/O).
const maxWrite = 128 << 10

// cacheTimeout is how long the kernel may trust entries and attributes: a mount lives for
// one command, and every change during it goes through the layer, so for all of it.
const cacheTimeout = time.Hour

// Config says where a Layer lives.
type Config struct {
	// Workspace is the host directory the layer passes through to. Required unless
	// Source is set.
	Workspace string
	// Mountpoint is an existing empty directory where the faulted view is mounted while
	// a command runs; the runtime binds it into the sandbox as its workspace. With Enter
	// set it is a path in that mount namespace (a container's /workspace). Required.
	Mountpoint string
	// Shadow is an existing empty directory, reachable by root only, where the layer
	// binds Workspace (no symlinks followed) while a command runs. Required unless
	// Source is set.
	Shadow string
	// Source, when set, replaces the Workspace bind at Shadow: at each Begin it returns
	// the directory the server passes through to, which must follow no symlink either
	// (a mount with MOUNT_ATTR_NOSYMFOLLOW), and the function End calls to let it go.
	Source func() (dir string, release func() error, err error)
	// Enter, when set, runs fn in the mount namespace Mountpoint lives in; nil runs it in
	// the caller's. See InMountNamespace.
	Enter func(fn func() error) error
	// Gate decides every operation's faults. Required.
	Gate *faultfs.Gate
}

// Layer is a faultfuse filesystem over one workspace. Begin mounts it for a command and
// End unmounts it once the command's processes are gone: a mount per command lets the
// kernel cache entries and attributes for the whole command (the host-side file tools
// change the workspace only between commands), and leaves nothing mounted, and nothing
// that could reach the workspace, between commands. A Layer is safe for concurrent use.
type Layer struct {
	cfg Config

	// mu: operations hold it shared while they touch the workspace; Begin, End and Close
	// take it exclusively.
	mu      sync.RWMutex
	open    bool
	closed  bool
	server  *fuse.Server
	conn    string       // the FUSE connection's id (its device minor), for an abort
	release func() error // lets the source go
	// sess lives from Begin to End: delays are spent against it, never against the
	// kernel's interrupt of the request (see gate).
	sess   context.Context
	cancel context.CancelFunc
	// handles counts open file handles, which hold descriptors under the source.
	handles atomic.Int64
}

// New checks cfg and that this host can mount FUSE (root, /dev/fuse) and returns a Layer,
// not mounted yet.
func New(cfg Config) (*Layer, error) {
	switch {
	case cfg.Source == nil && cfg.Workspace == "":
		return nil, errors.New("faultfuse: config: workspace: required")
	case cfg.Source == nil && cfg.Shadow == "":
		return nil, errors.New("faultfuse: config: shadow: required")
	case cfg.Mountpoint == "":
		return nil, errors.New("faultfuse: config: mountpoint: required")
	case cfg.Gate == nil:
		return nil, errors.New("faultfuse: config: gate: required")
	}
	var dirs []string
	if cfg.Source == nil {
		dirs = append(dirs, cfg.Workspace, cfg.Shadow)
	}
	if cfg.Enter == nil {
		dirs = append(dirs, cfg.Mountpoint)
	}
	for _, d := range dirs {
		if st, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("faultfuse: %w", err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("faultfuse: %s is not a directory", d)
		}
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("faultfuse: open /dev/fuse (FUSE needs the fuse module and root): %w", err)
	}
	unix.Close(fd)
	return &Layer{cfg: cfg}, nil
}

// Open is New followed by one Begin and End, so that a host (or a sandbox) where the
// layer cannot mount is told now, not by the first command.
func Open(cfg Config) (*Layer, error) {
	l, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := l.Begin(); err != nil {
		return nil, err
	}
	if err := l.End(); err != nil {
		return nil, err
	}
	return l, nil
}

// InMountNamespace returns a Config.Enter that runs fn in the mount namespace of the
// process pid returns (a container's init), on an OS thread of its own that leaves the
// caller's filesystem context (unshare CLONE_FS) and is discarded afterwards.
func InMountNamespace(pid func() (int, error)) func(fn func() error) error {
	return func(fn func() error) error {
		p, err := pid()
		if err != nil {
			return err
		}
		ns, err := unix.Open("/proc/"+strconv.Itoa(p)+"/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("faultfuse: mount namespace of %d: %w", p, err)
		}
		defer unix.Close(ns)
		done := make(chan error, 1)
		go func() {
			// The thread is never unlocked: it ends with the goroutine, so no other
			// goroutine ever runs in the other namespace.
			runtime.LockOSThread()
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				done <- fmt.Errorf("faultfuse: unshare fs: %w", err)
				return
			}
			if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
				done <- fmt.Errorf("faultfuse: enter mount namespace of %d: %w", p, err)
				return
			}
			done <- fn()
		}()
		return <-done
	}
}

// in runs fn where the mount point lives.
func (l *Layer) in(fn func() error) error {
	if l.cfg.Enter == nil {
		return fn()
	}
	return l.cfg.Enter(fn)
}

// Begin mounts the layer for a command: it makes the source (the workspace bound at the
// shadow directory with MS_NOSYMFOLLOW, or Config.Source), mounts the FUSE filesystem
// over it at the mount point and serves it.
func (l *Layer) Begin() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.open {
		return nil
	}
	src, release, err := l.source()
	if err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(src, &st); err != nil {
		return errors.Join(fmt.Errorf("faultfuse: source: %w", err), release())
	}
	srv, err := l.mount(src, st.Dev)
	if err != nil {
		return errors.Join(err, release())
	}
	l.conn = l.connID()
	l.server, l.release, l.open = srv, release, true
	l.sess, l.cancel = context.WithCancel(context.Background())
	return nil
}

// source makes the directory the server passes through to.
func (l *Layer) source() (string, func() error, error) {
	if l.cfg.Source != nil {
		dir, release, err := l.cfg.Source()
		if err != nil {
			return "", nil, fmt.Errorf("faultfuse: source: %w", err)
		}
		return dir, release, nil
	}
	if err := unix.Mount(l.cfg.Workspace, l.cfg.Shadow, "", unix.MS_BIND, ""); err != nil {
		return "", nil, fmt.Errorf("faultfuse: bind workspace: %w", err)
	}
	release := func() error {
		if err := unix.Unmount(l.cfg.Shadow, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("faultfuse: unmount %s: %w", l.cfg.Shadow, err)
		}
		return nil
	}
	if err := unix.Mount("", l.cfg.Shadow, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSYMFOLLOW|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return "", nil, errors.Join(fmt.Errorf("faultfuse: bind workspace nosymfollow: %w", err), release())
	}
	return l.cfg.Shadow, release, nil
}

// mount mounts the FUSE filesystem over src and starts its server.
func (l *Layer) mount(src string, dev uint64) (*fuse.Server, error) {
	root := &node{LoopbackNode: &gofs.LoopbackNode{RootData: &gofs.LoopbackRoot{Path: src, Dev: dev}}, l: l}
	root.RootData.RootNode = root
	timeout := cacheTimeout
	// NullPermissions: the library would otherwise show mode 000 as 0755 (directories) or
	// 0644 (files), so `chmod 000` was lost to the command and not enforced by the kernel
	// (default_permissions checks the mode the server reports).
	opts := &gofs.Options{EntryTimeout: &timeout, AttrTimeout: &timeout, NegativeTimeout: &timeout, NullPermissions: true}
	opts.MountOptions = fuse.MountOptions{
		FsName: "gauntlet-faultfuse", Name: "gauntlet", MaxWrite: maxWrite,
		EnableLocks: true, DisableXAttrs: true,
		// Small reads are the common case; copying them beats a pipe per splice.
		DisableSplice: true,
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("faultfuse: open /dev/fuse: %w", err)
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions,max_read=%d", fd, maxWrite)
	if err := l.in(func() error {
		return unix.Mount("gauntlet-faultfuse", l.cfg.Mountpoint, "fuse.gauntlet", unix.MS_NOSUID|unix.MS_NODEV, data)
	}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("faultfuse: mount %s: %w", l.cfg.Mountpoint, err)
	}
	// The server takes the descriptor over ("/dev/fd/N" tells go-fuse it is mounted).
	srv, err := fuse.NewServer(gofs.NewNodeFS(root, opts), "/dev/fd/"+strconv.Itoa(fd), &opts.MountOptions)
	if err != nil {
		_ = l.unmountPoint()
		unix.Close(fd)
		return nil, fmt.Errorf("faultfuse: serve %s: %w", l.cfg.Mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		_ = l.unmountPoint()
		return nil, fmt.Errorf("faultfuse: mount %s: %w", l.cfg.Mountpoint, err)
	}
	return srv, nil
}

// unmountPoint unmounts the FUSE filesystem, lazily when it is still busy.
func (l *Layer) unmountPoint() error {
	return l.in(func() error {
		if err := unix.Unmount(l.cfg.Mountpoint, 0); err != nil {
			if err := unix.Unmount(l.cfg.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("faultfuse: unmount %s: %w", l.cfg.Mountpoint, err)
			}
		}
		return nil
	})
}

// End unmounts the layer after a command (whose processes are all gone): it waits, up to
// two seconds, for the kernel to release the command's open files, refuses further
// operations, unmounts the FUSE filesystem (lazily if still busy), lets the source go
// and waits for the server to stop, so the workspace can be remounted (snapshots,
// restores) without the layer holding it.
func (l *Layer) End() error {
	l.mu.RLock()
	cancel := l.cancel
	l.mu.RUnlock()
	if cancel != nil {
		cancel() // ends the delays still being spent, so they let go of mu
	}
	deadline := time.Now().Add(2 * time.Second)
	for l.handles.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	l.mu.Lock()
	if !l.open {
		l.mu.Unlock()
		return nil
	}
	l.open = false
	srv, release, conn := l.server, l.release, l.conn
	l.server, l.release, l.sess, l.cancel = nil, nil, nil, nil
	errs := []error{l.unmountPoint(), release()}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		// A mount namespace made while the layer was mounted (another sandbox's, a
		// container shim's) holds a copy of the mount, which keeps the connection alive:
		// abort it, so the server stops and the copy fails with ENOTCONN.
		if err := abort(conn); err != nil {
			errs = append(errs, err)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			errs = append(errs, errors.New("faultfuse: server did not stop within 5s of the abort"))
		}
	}
	return errors.Join(errs...)
}

// connID returns the FUSE connection id of the layer's mount (the minor of its device,
// as fusectl names it), read from the mount table where the mount point lives; "" when
// not found.
func (l *Layer) connID() string {
	var id string
	_ = l.in(func() error {
		mounts, err := procfs.Mounts() // this thread's: in the namespace l.in entered
		if err != nil {
			return err
		}
		for _, m := range mounts {
			if m.Point != l.cfg.Mountpoint || m.FSType != "fuse.gauntlet" {
				continue
			}
			if _, minor, ok := strings.Cut(m.Device, ":"); ok {
				id = minor // the last one is the top of the mount point
			}
		}
		return nil
	})
	return id
}

// fusectl is where the fusectl filesystem lists FUSE connections.
const fusectl = "/sys/fs/fuse/connections"

// abort aborts FUSE connection id through fusectl, mounting fusectl when needed.
func abort(id string) error {
	if id == "" {
		return errors.New("faultfuse: server did not stop after the unmount, and its connection is unknown")
	}
	p := fusectl + "/" + id + "/abort"
	if _, err := os.Stat(p); err != nil {
		if err := unix.Mount("fusectl", fusectl, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("faultfuse: mount fusectl to abort connection %s: %w", id, err)
		}
	}
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		return fmt.Errorf("faultfuse: abort connection %s: %w", id, err)
	}
	return nil
}

// Close ends the layer; Begin fails after it.
func (l *Layer) Close() error {
	err := l.End()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
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

// admit admits an operation (enter) and passes its event (gate); when the errno is 0 the
// caller must leave.
func (l *Layer) admit(op, name string) (catalogue.Decision, syscall.Errno) {
	if !l.enter() {
		return catalogue.Decision{}, syscall.EIO
	}
	dec, errno := l.gate(op, name)
	if errno != 0 {
		l.leave()
	}
	return dec, errno
}

// gate passes one storage event; its error is the errno the operation fails with. The
// caller holds mu shared (enter). Delays are spent like a slow disk's, in uninterruptible
// sleep: a signal to the waiting process (which makes the kernel send the request an
// interrupt) does not cut them short, because an EINTR would make many programs retry the
// call, a new event the same command without the signal would not make; a fatal signal
// ends the wait for the process, and End ends the delay itself.
func (l *Layer) gate(op, name string) (catalogue.Decision, syscall.Errno) {
	dec, err := l.cfg.Gate.Before(l.sess, op, name)
	if err == nil {
		return dec, 0
	}
	var pe *fs.PathError
	var en syscall.Errno
	switch {
	case errors.As(err, &pe) && errors.As(pe.Err, &en):
		return dec, en
	case errors.Is(err, context.Canceled):
		return dec, syscall.EINTR // End: the command is over
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
