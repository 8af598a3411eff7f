//go:build linux

// Package netns creates network namespaces and listening sockets inside them from the
// host process (A1, A5): a sandbox keeps its loopback-only network, and a service the
// host forwards to it answers inside that network, while Accept and the forwarding run
// in the host process.
//
// The technique: a goroutine locks its OS thread, moves that thread into the target
// namespace with setns(2) (or a fresh one with unshare(2)), creates the socket there and
// returns without unlocking. A socket belongs to the namespace it was created in for its
// whole life, whichever thread later uses it; the thread, whose namespace no longer
// matches the rest of the process, exits with its goroutine instead of going back to the
// scheduler, so no other goroutine ever runs in the wrong namespace.
package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// onThread runs fn on a fresh OS thread that never returns to the scheduler.
func onThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		errc <- fn()
	}()
	return <-errc
}

// Create makes a new network namespace whose only interface is lo (up), pinned by a bind
// mount at path (a file that must not exist yet), like `ip netns add`. It lives until
// Remove, across restarts of the process.
func Create(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	f.Close()
	err = onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := loopbackUp(); err != nil {
			return err
		}
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return nil
}

// loopbackUp brings lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// Pinned reports whether path is a pinned network namespace (an nsfs mount).
func Pinned(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// Remove unpins the namespace at path and removes the file; a missing path is no error.
// The namespace itself ends when nothing else (a process, a socket) still uses it.
func Remove(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netns: unpin %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns: %w", err)
	}
	return nil
}

// Listen listens on network and address (as net.Listen) inside the network namespace
// named by nsPath: a pinned namespace or /proc/<pid>/ns/net.
func Listen(nsPath, network, address string) (net.Listener, error) {
	var l net.Listener
	err := onThread(func() error {
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open: %w", err)
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		l, err = net.Listen(network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in netns %s: %w", address, nsPath, err)
	}
	return l, nil
}
