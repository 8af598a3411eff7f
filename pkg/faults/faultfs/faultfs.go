// Package faultfs applies gauntlet's storage faults to the file operations of a
// sandbox's file tools: IO latency, an IOPS cap, disk full (ENOSPC), inode exhaustion
// (ENOSPC on create), too many open files (EMFILE), a read-only filesystem after a full
// journal (EROFS), lock contention (EWOULDBLOCK) and short writes.
//
// An FS is rooted at a directory; every operation is an event of layer storage with its
// op (open, create, read, write, lock, mkdir, remove, rename, stat) and its path relative
// to the root, decided by a inject.Decider with the stream key "fs/<path>": the faults a
// file meets depend on the seed and on that file's own history, not on how operations on
// other files interleave. Errors are *fs.PathError wrapping the syscall errno, exactly as
// the os package reports the real thing, so errors.Is(err, syscall.ENOSPC) holds.
package faultfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
)

// FS is a directory tree whose operations meet storage faults.
type FS struct {
	root   string
	d      *inject.Decider
	onFire func(key string, ev catalogue.Event, fired []catalogue.Fired)
	// sleep waits; tests of virtual-time callers may replace it.
	sleep func(time.Duration)
}

// New returns an FS rooted at root (which must exist). onFire, when not nil, receives
// every fault that fires, to be recorded as a step event.
func New(root string, d *inject.Decider, onFire func(key string, ev catalogue.Event, fired []catalogue.Fired)) (*FS, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("faultfs: root: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("faultfs: root %s is not a directory", root)
	}
	return &FS{root: root, d: d, onFire: onFire, sleep: time.Sleep}, nil
}

// resolve maps a slash-separated name relative to the root to a host path, refusing
// names that would escape the root.
func (f *FS) resolve(op, name string) (string, error) {
	clean := filepath.ToSlash(filepath.Clean("/" + name))[1:]
	if clean == "" {
		clean = "."
	}
	if !filepath.IsLocal(filepath.FromSlash(clean)) && clean != "." {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return filepath.Join(f.root, filepath.FromSlash(clean)), nil
}

// decide evaluates the event of op on name through the FS's gate: it sleeps the delay and
// returns the abort as a PathError, and the decision for the caller's rewrites.
func (f *FS) decide(op, name string) (catalogue.Decision, error) {
	g := Gate{d: f.d, onFire: f.onFire, wait: func(_ context.Context, d time.Duration) error { f.sleep(d); return nil }}
	return g.Before(context.Background(), op, name)
}

// OpenFile opens name like os.OpenFile. Creating a file that does not exist is a create
// event (disk full, inode exhaustion, read-only); every open is also an open event (too
// many open files). A read-only filesystem fails writes through files already open, as
// after a journal abort remounts it read-only.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (*File, error) {
	p, err := f.resolve("open", name)
	if err != nil {
		return nil, err
	}
	if flag&os.O_CREATE != 0 {
		if _, serr := os.Lstat(p); errors.Is(serr, fs.ErrNotExist) {
			if _, err := f.decide(catalogue.OpCreate, name); err != nil {
				return nil, err
			}
		}
	}
	if _, err := f.decide(catalogue.OpOpen, name); err != nil {
		return nil, err
	}
	osf, err := os.OpenFile(p, flag, perm)
	if err != nil {
		return nil, err
	}
	return &File{f: osf, fs: f, name: name}, nil
}

// Open opens name for reading.
func (f *FS) Open(name string) (*File, error) { return f.OpenFile(name, os.O_RDONLY, 0) }

// Create creates or truncates name for writing.
func (f *FS) Create(name string) (*File, error) {
	return f.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// WriteFile writes data to name, creating it, like os.WriteFile.
func (f *FS) WriteFile(name string, data []byte, perm fs.FileMode) error {
	file, err := f.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = file.Write(data)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadFile reads name whole, like os.ReadFile.
func (f *FS) ReadFile(name string) ([]byte, error) {
	file, err := f.Open(name)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return io.ReadAll(file)
}

// Mkdir creates a directory.
func (f *FS) Mkdir(name string, perm fs.FileMode) error {
	p, err := f.resolve("mkdir", name)
	if err != nil {
		return err
	}
	if _, err := f.decide(catalogue.OpMkdir, name); err != nil {
		return err
	}
	return os.Mkdir(p, perm)
}

// Remove removes a file or empty directory.
func (f *FS) Remove(name string) error {
	p, err := f.resolve("remove", name)
	if err != nil {
		return err
	}
	if _, err := f.decide(catalogue.OpRemove, name); err != nil {
		return err
	}
	return os.Remove(p)
}

// Rename renames oldname to newname.
func (f *FS) Rename(oldname, newname string) error {
	po, err := f.resolve("rename", oldname)
	if err != nil {
		return err
	}
	pn, err := f.resolve("rename", newname)
	if err != nil {
		return err
	}
	if _, err := f.decide(catalogue.OpRename, oldname); err != nil {
		return err
	}
	return os.Rename(po, pn)
}

// Stat returns name's FileInfo.
func (f *FS) Stat(name string) (fs.FileInfo, error) {
	p, err := f.resolve("stat", name)
	if err != nil {
		return nil, err
	}
	if _, err := f.decide(catalogue.OpStat, name); err != nil {
		return nil, err
	}
	return os.Stat(p)
}

// File is an open file of an FS.
type File struct {
	f    *os.File
	fs   *FS
	name string
}

// Name returns the name the file was opened with.
func (fl *File) Name() string { return fl.name }

// Read reads like os.File.Read after the read event's latency.
func (fl *File) Read(p []byte) (int, error) {
	if _, err := fl.fs.decide(catalogue.OpRead, fl.name); err != nil {
		return 0, err
	}
	return fl.f.Read(p)
}

// Write writes like os.File.Write, as one write event: disk full and read-only fail it,
// a short write stores only part of p and returns io.ErrShortWrite with the count.
func (fl *File) Write(p []byte) (int, error) {
	dec, err := fl.fs.decide(catalogue.OpWrite, fl.name)
	if err != nil {
		return 0, err
	}
	if dec.WriteKeep < 1 {
		k := int(float64(len(p)) * dec.WriteKeep)
		n, err := fl.f.Write(p[:k])
		if err == nil {
			err = io.ErrShortWrite
		}
		return n, err
	}
	return fl.f.Write(p)
}

// Lock takes an exclusive advisory lock without blocking (flock LOCK_EX|LOCK_NB); lock
// contention makes it wait wait_ms and fail with EWOULDBLOCK, as if another process held
// the lock.
func (fl *File) Lock() error {
	if _, err := fl.fs.decide(catalogue.OpLock, fl.name); err != nil {
		return err
	}
	if err := syscall.Flock(int(fl.f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return &fs.PathError{Op: "lock", Path: fl.name, Err: err}
	}
	return nil
}

// Unlock releases the lock.
func (fl *File) Unlock() error {
	if err := syscall.Flock(int(fl.f.Fd()), syscall.LOCK_UN); err != nil {
		return &fs.PathError{Op: "unlock", Path: fl.name, Err: err}
	}
	return nil
}

// Close closes the file.
func (fl *File) Close() error { return fl.f.Close() }
