//go:build linux

// Package netns creates network namespaces and listening sockets inside them from the
// host process: a sandbox keeps its loopback-only network, and a service the
// host forwards to it answers inside that network, while Accept and the forwarding run
// in the host process. WatchRefusals opens a filtered packet socket on a namespace's
// loopback the same way, to see the connections its kernel refuses there.
//
// The technique: a goroutine locks its OS thread, remembers the thread's namespace, moves
// the thread into the target namespace with setns(2) (or a fresh one with unshare(2)),
// creates the socket there, moves the thread back and unlocks it. A socket belongs to the
// namespace it was created in for its whole life, whichever thread later uses it, so
// Accept and the forwarding run on any thread of the host process.
//
// The thread is restored rather than left to exit locked (the other common recipe)
// because a thread's exit is a parent death for every child it forked with Pdeathsig: the
// process runtime's launchers and the test daemons are started that way, from whatever
// thread the Go scheduler had at hand, and would be killed with it. If the thread cannot
// be restored its goroutine parks for good, keeping the thread off the scheduler and
// alive: one leaked thread, never a goroutine running in the wrong namespace.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on a locked OS thread moved into a network namespace by enter, then
// moves the thread back to the namespace it had.
func inNetns(enter func() error, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := enter(); err != nil {
			runtime.UnlockOSThread() // the thread did not move
			errc <- err
			return
		}
		err = fn()
		if rerr := unix.Setns(orig, unix.CLONE_NEWNET); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", rerr))
			select {} // never give the thread back, and never let it exit (see the package doc)
		}
		runtime.UnlockOSThread()
		errc <- err
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
	err = inNetns(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		return nil
	}, func() error {
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

// joiner returns the step that moves the calling thread into the network namespace named
// by nsPath.
func joiner(nsPath string) func() error {
	return func() error {
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return nil
	}
}

// Listen listens on network and address (as net.Listen) inside the network namespace
// named by nsPath: a pinned namespace or /proc/<pid>/ns/net. The address must be a
// literal IP and port.
func Listen(nsPath, network, address string) (net.Listener, error) {
	if err := literal(address); err != nil {
		return nil, err
	}
	var l net.Listener
	err := inNetns(joiner(nsPath), func() error {
		var err error
		l, err = net.Listen(network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in netns %s: %w", address, nsPath, err)
	}
	return l, nil
}

// Dial connects to address (as net.Dial) from inside the network namespace named by
// nsPath: host code reaching a service as the sandbox sees it (health checks, tests,
// benchmarks). The address must be a literal IP and port.
func Dial(ctx context.Context, nsPath, network, address string) (net.Conn, error) {
	if err := literal(address); err != nil {
		return nil, err
	}
	var c net.Conn
	err := inNetns(joiner(nsPath), func() error {
		// The socket is made and connected on this thread (a literal address needs no
		// lookup, which could run elsewhere).
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s in netns %s: %w", address, nsPath, err)
	}
	return c, nil
}

// literal checks that address needs no name lookup: a lookup may run on other threads,
// in the host's namespace.
func literal(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("netns: address %q: %w", address, err)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("netns: address %q: want a literal IP (a name lookup would run outside the namespace)", address)
	}
	return nil
}

// ListenPacket opens a packet socket on network and address (as net.ListenPacket, e.g.
// "udp", "127.0.0.53:53") inside the network namespace named by nsPath. The address must
// be a literal IP and port.
func ListenPacket(nsPath, network, address string) (net.PacketConn, error) {
	if err := literal(address); err != nil {
		return nil, err
	}
	var pc net.PacketConn
	err := inNetns(joiner(nsPath), func() error {
		var err error
		pc, err = net.ListenPacket(network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s/%s in netns %s: %w", network, address, nsPath, err)
	}
	return pc, nil
}
