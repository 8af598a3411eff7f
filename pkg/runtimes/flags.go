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
	fs.Var(&c.Hosts, "sandbox.hosts", "where the allowed hosts of tasks (task.toml's allowed_hosts) are reached from this machine: NAME=HOST:PORT (NAME's plain HTTP, port 80) or NAME:PORT=HOST:PORT (that port of NAME: 443 for HTTPS, or another, relayed as TLS), comma-separated or repeated; a port not listed is reached at NAME:PORT")
}

// RegisterFlags declares the images.* flags: where task images are built and pulled.
func (c *ImagesConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Registry, "images.registry", "", "registry (host:port) task images are built into and pulled from (scripts/registry.sh start; needed by tasks with a Dockerfile on containerd)")
	fs.StringVar(&c.DockerHubMirror, "images.docker-hub-mirror", "", "registry asked first for Docker Hub images (FROM debian:...): a pull-through cache, or offline the local registry")
	fs.StringVar(&c.CacheDir, "images.cache-dir", "", "image builder's storage and logs (default: the user's cache directory, gauntlet/images)")
}

// HostsFlag is NAME=HOST:PORT and NAME:PORT=HOST:PORT entries, as a flag.Value:
// Config.Hosts. Its keys are sandbox.HostMap's: NAME for port 80, NAME:PORT for another.
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

// Set adds NAME=HOST:PORT and NAME:PORT=HOST:PORT entries (comma-separated); NAME is a
// lower-case host name, each of its ports mapped once (NAME alone and NAME:80 are the
// same port). Every error names the entry.
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
			return fmt.Errorf("entry %q: want NAME=HOST:PORT or NAME:PORT=HOST:PORT", e)
		}
		name, port, ok := sandbox.SplitHostKey(key)
		if !ok {
			return fmt.Errorf("entry %q: %q is not NAME or NAME:PORT, NAME a lower-case host name and PORT 1-65535", e, key)
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
		if _, dup := (*h)[key]; dup {
			return fmt.Errorf("entry %q: port %d of host %s is mapped twice", e, port, name)
		}
		(*h)[key] = addr
	}
	return nil
}
