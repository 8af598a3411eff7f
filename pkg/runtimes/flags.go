package runtimes

import (
	"flag"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// RegisterFlags declares the sandbox.* flags of a serving process on fs with their
// defaults. StateDir's default depends on the data dir, so it is left empty here and
// filled in by whoever knows the data dir.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Runtime, "sandbox.runtime", "", "sandbox runtime of envs that run commands (codefix): process, containerd, or empty for none")
	fs.StringVar(&c.Image, "sandbox.image", "", "root filesystem of sandboxes: a containerd image reference; for process empty (the host's, read-only)")
	fs.StringVar(&c.StateDir, "sandbox.state-dir", "", "state directory of the sandbox runtime (default: <data-dir>/sandbox)")
	fs.StringVar(&c.Containerd, "sandbox.containerd", "", "socket of a running containerd (scripts/containerd.sh start; default: start a private one)")
	fs.IntVar(&c.PoolSize, "sandbox.pool-size", 2, "warm sandboxes kept per sandbox template (0: create each on demand)")
	fs.IntVar(&c.ImagePools, "sandbox.image-pools", DefaultImagePools, "warm pools kept for task images, one per image; a pool idle for sandbox.image-pool-idle gives way to a new image's")
	fs.DurationVar(&c.ImagePoolIdle, "sandbox.image-pool-idle", DefaultImagePoolIdle, "how long a task image's warm pool goes without an episode before a new image may take its place")
	c.Images.RegisterFlags(fs)
	c.RegisterHostsFlag(fs)
	fs.StringVar(&c.AgentBinary, "sandbox.agent", "", "static in-sandbox agent for containerd sandboxes (default: build it with the Go toolchain)")
}

// RegisterHostsFlag declares --sandbox.hosts alone, for commands that declare the other
// sandbox flags their own way.
func (c *Config) RegisterHostsFlag(fs *flag.FlagSet) {
	fs.Var(&c.Hosts, "sandbox.hosts", "where the allowed hosts of tasks (task.toml's allowed_hosts) are reached from this machine: NAME=HOST:PORT (NAME's plain HTTP, port 80), NAME:PORT=HOST:PORT (that port of NAME: 443 for HTTPS, or another, relayed as TLS) or NAME:PORT/tcp=HOST:PORT (that port relayed as plain TCP, to NAME alone), comma-separated or repeated; a port not listed is reached at NAME:PORT")
}

// RegisterFlags declares the images.* flags: where task images are built and pulled.
func (c *ImagesConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Registry, "images.registry", "", "registry (host:port) task images are built into and pulled from (scripts/registry.sh start; needed by tasks with a Dockerfile on containerd)")
	fs.StringVar(&c.DockerHubMirror, "images.docker-hub-mirror", "", "registry asked first for Docker Hub images (FROM debian:...): a pull-through cache, or offline the local registry")
	fs.StringVar(&c.CacheDir, "images.cache-dir", "", "image builder's storage and logs (default: the user's cache directory, gauntlet/images)")
}

// HostsFlag is NAME=HOST:PORT, NAME:PORT=HOST:PORT and NAME:PORT/tcp=HOST:PORT entries,
// as a flag.Value: Config.Hosts. Its keys are sandbox.HostMap's: NAME for port 80,
// NAME:PORT for a TLS port, NAME:PORT/tcp for a plain TCP one.
type HostsFlag map[string]string

// String lists the entries, sorted.
func (h HostsFlag) String() string {
	out := make([]string, 0, len(h))
	for k, v := range h {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// Set adds NAME=HOST:PORT, NAME:PORT=HOST:PORT and NAME:PORT/tcp=HOST:PORT entries
// (comma-separated); NAME is a lower-case host name, each of its ports mapped once (NAME
// alone and NAME:80 are the same port). A plain TCP port carries no host name, so the
// gateway knows its host by the port alone: it is one host's, mapped for no other host,
// and neither 80 (HTTP) nor 443 (HTTPS). Every error names the entry.
func (h *HostsFlag) Set(v string) error {
	if *h == nil {
		*h = HostsFlag{}
	}
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		key, addr, ok := strings.Cut(e, "=")
		if !ok {
			return fmt.Errorf("entry %q: want NAME=HOST:PORT, NAME:PORT=HOST:PORT or NAME:PORT/tcp=HOST:PORT", e)
		}
		key, tcp := strings.CutSuffix(key, sandbox.TCPSuffix)
		name, port, ok := sandbox.SplitHostKey(key)
		if !ok || tcp && !strings.Contains(key, ":") {
			return fmt.Errorf("entry %q: %q is not NAME, NAME:PORT or NAME:PORT/tcp, NAME a lower-case host name and PORT 1-65535", e, key)
		}
		if tcp && (port == sandbox.HTTPPort || port == httpsPort) {
			return fmt.Errorf("entry %q: port %d is HTTP or HTTPS for every allowed host, never plain TCP", e, port)
		}
		if other, isTCP, taken := h.portOwner(port); taken && other != name && (tcp || isTCP) {
			return fmt.Errorf("entry %q: port %d is mapped for host %s too: a plain TCP port names no host, so it is one host's alone", e, port, other)
		}
		if host, p, err := net.SplitHostPort(addr); err != nil || host == "" || p == "" {
			return fmt.Errorf("entry %q: %q is not HOST:PORT", e, addr)
		} else if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("entry %q: %q: port must be 1-65535", e, addr)
		}
		if port == sandbox.HTTPPort {
			key = name // the form without a port, as before ports could be named
		} else {
			key = net.JoinHostPort(name, strconv.Itoa(port))
		}
		_, dup := (*h)[key]
		_, dupTCP := (*h)[key+sandbox.TCPSuffix]
		if dup || dupTCP {
			return fmt.Errorf("entry %q: port %d of host %s is mapped twice", e, port, name)
		}
		if tcp {
			key += sandbox.TCPSuffix
		}
		(*h)[key] = addr
	}
	return nil
}

// httpsPort is the port every allowed host's HTTPS is relayed on.
const httpsPort = 443

// portOwner returns a host the flag maps port for, and whether that mapping is plain TCP.
func (h HostsFlag) portOwner(port int) (name string, tcp, ok bool) {
	for k := range h {
		k, isTCP := strings.CutSuffix(k, sandbox.TCPSuffix)
		if n, p, ok := sandbox.SplitHostKey(k); ok && p == port {
			if isTCP || name == "" {
				name, tcp = n, isTCP
			}
		}
	}
	return name, tcp, name != ""
}
