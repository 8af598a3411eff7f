//go:build linux

package faultfuse

import (
	"context"
	"path"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
)

// WrapChild makes every node of the tree a gated node.
func (n *node) WrapChild(_ context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	if lb, ok := ops.(*gofs.LoopbackNode); ok {
		return &node{LoopbackNode: lb, l: n.l}
	}
	return ops
}

// rel is the node's path relative to the workspace root ("" for the root).
func (n *node) rel() string { return n.EmbeddedInode().Path(nil) }

// child is the workspace-relative path of name in directory n.
func (n *node) child(name string) string { return path.Join(n.rel(), name) }

// Operations that resolve paths in the workspace run only while the layer is open.

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if !n.l.enter() {
		return nil, syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if !n.l.enter() {
		return syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Getattr(ctx, f, out)
}

func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if !n.l.enter() {
		return syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

func (n *node) Statx(ctx context.Context, f gofs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if !n.l.enter() {
		return syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Statx(ctx, f, flags, mask, out)
}

func (n *node) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	if !n.l.enter() {
		return nil, syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Readdir(ctx)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if !n.l.enter() {
		return nil, syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Readlink(ctx)
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if !n.l.enter() {
		return syscall.EIO
	}
	defer n.l.leave()
	return n.LoopbackNode.Statfs(ctx, out)
}

// Gated operations: the event first, then the real operation.

func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	name := n.rel()
	_, errno := n.l.admit(catalogue.OpOpen, name)
	if errno != 0 {
		return nil, 0, errno
	}
	defer n.l.leave()
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.l.wrap(fh, name), fl | fuse.FOPEN_DIRECT_IO, 0
}

// OpendirHandle reads the whole directory at once and holds no descriptor: a directory
// stream left open when the command ends (its release is asynchronous) would otherwise
// keep the source mounted after End.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	_, errno := n.l.admit(catalogue.OpOpen, n.rel())
	if errno != 0 {
		return nil, 0, errno
	}
	defer n.l.leave()
	ds, errno := n.LoopbackNode.Readdir(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	defer ds.Close()
	var list []fuse.DirEntry
	for ds.HasNext() {
		e, errno := ds.Next()
		if errno != 0 {
			return nil, 0, errno
		}
		list = append(list, e)
	}
	return gofs.NewListDirStream(list).(gofs.FileHandle), 0, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	p := n.child(name)
	_, errno := n.l.admit(catalogue.OpCreate, p)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	defer n.l.leave()
	if _, errno := n.l.gate(catalogue.OpOpen, p); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, n.l.wrap(fh, p), fl | fuse.FOPEN_DIRECT_IO, 0
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	_, errno := n.l.admit(catalogue.OpCreate, n.child(name))
	if errno != 0 {
		return nil, errno
	}
	defer n.l.leave()
	return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	_, errno := n.l.admit(catalogue.OpCreate, n.child(name))
	if errno != 0 {
		return nil, errno
	}
	defer n.l.leave()
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	_, errno := n.l.admit(catalogue.OpCreate, n.child(name))
	if errno != 0 {
		return nil, errno
	}
	defer n.l.leave()
	if t, ok := target.(*node); ok {
		target = t.LoopbackNode
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	_, errno := n.l.admit(catalogue.OpMkdir, n.child(name))
	if errno != 0 {
		return nil, errno
	}
	defer n.l.leave()
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	_, errno := n.l.admit(catalogue.OpRemove, n.child(name))
	if errno != 0 {
		return errno
	}
	defer n.l.leave()
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	_, errno := n.l.admit(catalogue.OpRemove, n.child(name))
	if errno != 0 {
		return errno
	}
	defer n.l.leave()
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	_, errno := n.l.admit(catalogue.OpRename, n.child(name))
	if errno != 0 {
		return errno
	}
	defer n.l.leave()
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

// CopyFileRange is refused so the kernel falls back to reads and writes, which are gated.
func (n *node) CopyFileRange(context.Context, gofs.FileHandle, uint64, *gofs.Inode, gofs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

// Tmpfile (O_TMPFILE) is refused; programs fall back to named files, which are gated.
func (n *node) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// wrap makes fh, a file opened as name, a gated file.
func (l *Layer) wrap(fh gofs.FileHandle, name string) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return fh
	}
	l.handles.Add(1)
	return &file{lf: lf, l: l, name: name}
}

// file is an open file whose reads, writes and locks pass the gate. It holds the
// LoopbackFile as a field, not embedded, so that go-fuse never sees the loopback's
// Writev or PassthroughFd (kernel passthrough would bypass the gate).
type file struct {
	lf   *gofs.LoopbackFile
	l    *Layer
	name string
}

var (
	_ gofs.FileReader    = (*file)(nil)
	_ gofs.FileWriter    = (*file)(nil)
	_ gofs.FileSetlker   = (*file)(nil)
	_ gofs.FileSetlkwer  = (*file)(nil)
	_ gofs.FileGetlker   = (*file)(nil)
	_ gofs.FileReleaser  = (*file)(nil)
	_ gofs.FileFlusher   = (*file)(nil)
	_ gofs.FileFsyncer   = (*file)(nil)
	_ gofs.FileGetattrer = (*file)(nil)
	_ gofs.FileSetattrer = (*file)(nil)
	_ gofs.FileLseeker   = (*file)(nil)
)

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	_, errno := f.l.admit(catalogue.OpRead, f.name)
	if errno != 0 {
		return nil, errno
	}
	defer f.l.leave()
	return f.lf.Read(ctx, dest, off)
}

// Write stores data; a short write stores its kept fraction and returns that count (the
// caller sees write(2) return less), or fails with ENOSPC when it keeps nothing, as a
// filling disk does.
func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	dec, errno := f.l.admit(catalogue.OpWrite, f.name)
	if errno != 0 {
		return 0, errno
	}
	defer f.l.leave()
	if dec.WriteKeep < 1 {
		k := int(float64(len(data)) * dec.WriteKeep)
		if k == 0 && len(data) > 0 {
			return 0, syscall.ENOSPC
		}
		data = data[:k]
	}
	return f.lf.Write(ctx, data, off)
}

// Setlk takes a lock without waiting; lock_contention fails it with EWOULDBLOCK after
// its wait.
func (f *file) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	if !f.l.enter() {
		return syscall.EIO
	}
	defer f.l.leave()
	if lk.Typ != syscall.F_UNLCK {
		if _, errno := f.l.gate(catalogue.OpLock, f.name); errno != 0 {
			return errno
		}
	}
	return f.lf.Setlk(ctx, owner, lk, flags)
}

// Setlkw takes a lock, waiting for it; lock_contention makes it wait wait_ms first (as
// if another process held it that long).
func (f *file) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	if !f.l.enter() {
		return syscall.EIO
	}
	defer f.l.leave()
	if lk.Typ != syscall.F_UNLCK {
		if _, errno := f.l.gate(catalogue.OpLock, f.name); errno != 0 && errno != syscall.EWOULDBLOCK {
			return errno
		}
	}
	return f.lf.Setlkw(ctx, owner, lk, flags)
}

func (f *file) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	return f.lf.Getlk(ctx, owner, lk, flags, out)
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	defer f.l.handles.Add(-1)
	return f.lf.Release(ctx)
}

func (f *file) Flush(ctx context.Context) syscall.Errno { return f.lf.Flush(ctx) }

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno { return f.lf.Fsync(ctx, flags) }

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.lf.Getattr(ctx, out)
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.lf.Setattr(ctx, in, out)
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.lf.Lseek(ctx, off, whence)
}
