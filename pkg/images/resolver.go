package images

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/log"
	dockercli "github.com/docker/cli/cli/config"
	"github.com/sirupsen/logrus"
)

// dockerConfigDir is the directory of the docker config.json the Store reads.
func (s *Store) dockerConfigDir() string { return s.docker }

// authFile is the docker config.json, the file buildah's --authfile takes; "" when it
// does not exist.
func (s *Store) authFile() string {
	p := filepath.Join(s.dockerConfigDir(), dockercli.ConfigFileName)
	if fileExists(p) {
		return p
	}
	return ""
}

// credentials returns the username and secret for host from the docker config file:
// its auths entry, or what its credsStore or credHelpers helper says, as the docker CLI
// does. A registry without credentials gets empty ones (anonymous access). The file is
// read on every call (a login meanwhile counts), which happens only when a registry
// asks for authentication.
func (s *Store) credentials(host string) (string, string, error) {
	cf, err := dockercli.Load(s.dockerConfigDir())
	if err != nil {
		return "", "", fmt.Errorf("read docker config in %s: %w", s.dockerConfigDir(), err)
	}
	// The docker CLI stores Docker Hub's credentials under its index server's URL.
	key := host
	if host == "registry-1.docker.io" || host == "docker.io" {
		key = "https://index.docker.io/v1/"
	}
	ac, err := cf.GetAuthConfig(key)
	if err != nil {
		return "", "", fmt.Errorf("credentials for %s from the docker config: %w", host, err)
	}
	if ac.IdentityToken != "" {
		return "", ac.IdentityToken, nil // a long-lived token: containerd's convention
	}
	return ac.Username, ac.Password, nil
}

// resolver is a containerd resolver for every registry: credentials from the docker
// config, hosts.toml from HostsDir when set, plain HTTP for loopback registries (such as
// registrylocal's) without the HTTPS attempt containerd's default makes first for them,
// and Docker Hub through DockerHubMirror first when set.
func (s *Store) resolver(ctx context.Context) remotes.Resolver {
	opts := config.HostOptions{Credentials: s.credentials}
	if s.hosts != "" {
		opts.HostDir = config.HostDirFromRoot(s.hosts)
	}
	remote := config.ConfigureHosts(ctx, opts)
	opts.DefaultScheme = "http"
	loopback := config.ConfigureHosts(ctx, opts)
	hosts := func(host string) ([]docker.RegistryHost, error) {
		if docker.IsLocalhost(host) {
			return loopback(host)
		}
		return remote(host)
	}
	if s.mirror == "" {
		return docker.NewResolver(docker.ResolverOptions{Hosts: hosts})
	}
	return docker.NewResolver(docker.ResolverOptions{Hosts: func(host string) ([]docker.RegistryHost, error) {
		all, err := hosts(host)
		if err != nil || host != "docker.io" {
			return all, err
		}
		// Docker Hub: the mirror first, for pulls only, then Docker Hub itself.
		mirror, err := hosts(s.mirror)
		if err != nil {
			return nil, err
		}
		for i := range mirror {
			mirror[i].Capabilities = docker.HostCapabilityPull | docker.HostCapabilityResolve
		}
		return append(mirror, all...), nil
	}})
}

// quiet gives containerd's client code, which logs through logrus from ctx (every
// HEAD that finds nothing, at info level; a content store on a filesystem without
// fs-verity, as a warning), a logger of its own that keeps only errors: what matters
// reaches the caller as an error.
func quiet(ctx context.Context) context.Context { return log.WithLogger(ctx, quietLog) }

var quietLog = func() *log.Entry {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	return logrus.NewEntry(l)
}()
