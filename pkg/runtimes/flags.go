package runtimes

import "flag"

// RegisterFlags declares the sandbox.* flags of a serving process on fs with their
// defaults. StateDir's default depends on the data dir, so it is left empty here and
// filled in by whoever knows the data dir.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Runtime, "sandbox.runtime", "", "sandbox runtime of envs that run commands (codefix): process, containerd, or empty for none")
	fs.StringVar(&c.Image, "sandbox.image", "", "root filesystem of sandboxes: a containerd image reference; for process empty (the host's, read-only)")
	fs.StringVar(&c.StateDir, "sandbox.state-dir", "", "state directory of the sandbox runtime (default: <data-dir>/sandbox)")
	fs.StringVar(&c.Containerd, "sandbox.containerd", "", "socket of a running containerd (scripts/containerd.sh start; default: start a private one)")
	fs.IntVar(&c.PoolSize, "sandbox.pool-size", 2, "warm sandboxes kept per sandbox template (0: create each on demand)")
	c.Images.RegisterFlags(fs)
	fs.StringVar(&c.AgentBinary, "sandbox.agent", "", "static in-sandbox agent for containerd sandboxes (default: build it with the Go toolchain)")
}

// RegisterFlags declares the images.* flags: where task images are built and pulled.
func (c *ImagesConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Registry, "images.registry", "", "registry (host:port) task images are built into and pulled from (scripts/registry.sh start; needed by tasks with a Dockerfile on containerd)")
	fs.StringVar(&c.DockerHubMirror, "images.docker-hub-mirror", "", "registry asked first for Docker Hub images (FROM debian:...): a pull-through cache, or offline the local registry")
	fs.StringVar(&c.CacheDir, "images.cache-dir", "", "image builder's storage and logs (default: the user's cache directory, gauntlet/images)")
}
