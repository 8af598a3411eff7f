package images

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// Errors Store's methods wrap, for errors.Is.
var (
	// ErrInvalid: a Source or Options that cannot work (both or neither of Context and
	// Image, a bad reference, a missing Dockerfile, a file type a context cannot hold).
	ErrInvalid = errors.New("invalid image source")
	// ErrNotInstalled: buildah is missing (scripts/deps.sh installs it).
	ErrNotInstalled = errors.New("buildah not found in PATH or /usr/bin: run scripts/deps.sh")
	// ErrBuild: the builder ran and failed (the error quotes the end of its output).
	ErrBuild = errors.New("image build failed")
	// ErrNotFound: the registry has no such image.
	ErrNotFound = errors.New("image not found")
)

// DefaultRepository names built images whose Source gives no Repository.
const DefaultRepository = "gauntlet/build"

// Options configures a Store.
type Options struct {
	// CacheDir holds buildah's storage, the build logs and locks, the content fetched
	// for Unpack and the unpacked root filesystems. Empty means
	// os.UserCacheDir()/gauntlet/images.
	CacheDir string
	// Registry is the host[:port] built images are pushed to and found in, as
	// Registry/Repository:ctx-<context digest>. Required by Build; Pull and Unpack
	// reach every registry their references name. A loopback registry
	// (registrylocal) is reached over plain HTTP.
	Registry string
	// Buildah is the buildah executable; empty finds it in PATH and /usr/bin.
	Buildah string
	// StorageDriver is buildah's storage driver: "overlay" (the default; needs a
	// CacheDir on a filesystem overlayfs accepts as upper layer, such as ext4 or xfs)
	// or "vfs" (works anywhere; copies every layer in full).
	StorageDriver string
	// DockerConfig is the directory of the docker config.json whose credentials
	// (auths, credsStore, credHelpers) are used for every registry; empty means
	// $DOCKER_CONFIG (as New finds it), else ~/.docker, as the docker CLI does.
	DockerConfig string
	// DockerHubMirror is a registry (host[:port]) asked first for every Docker Hub
	// image, by buildah (FROM debian:bookworm-slim) and by containerd (Pull, Unpack),
	// under the same repository names ("library/debian"); Docker Hub itself stays the
	// fallback. A pull-through cache in production; offline, the local registry the
	// base image was pushed to (scripts/base-image.sh pushes it as library/debian), so
	// task Dockerfiles build unchanged. Empty asks Docker Hub directly.
	DockerHubMirror string
	// HostsDir is a containerd hosts directory (hosts.toml per registry: mirrors, CA
	// certificates, plain HTTP), as /etc/containerd/certs.d; empty uses none.
	HostsDir string
	// Logger receives one line per build, push, pull and unpack; nil discards them.
	Logger *slog.Logger
}

// Store builds, pushes, pulls and unpacks images. A Store is safe for concurrent use:
// two builds of the same context (in this process or another over the same CacheDir)
// run the builder once, and the second finds the first's image.
type Store struct {
	cache    string
	registry string
	mirror   string
	buildah  string // "" until the first build looks it up
	driver   string
	docker   string
	hosts    string
	log      *slog.Logger

	mu sync.Mutex // guards buildah and content

	// content is Unpack's content store, opened once: opening it logs a warning through
	// containerd's global logger on filesystems without fs-verity, once per open.
	content content.Store
}

// Source is where a task's image comes from: a build context (a task's
// environment/ folder with its Dockerfile) or an image reference.
type Source struct {
	// Context is the build context directory. Exactly one of Context and Image.
	Context string
	// Dockerfile is the Dockerfile's path relative to Context; empty means
	// "Dockerfile".
	Dockerfile string
	// Image is a reference ("python:3.12-slim", "registry.example.com/t/x@sha256:...")
	// used as it is, pulled from the registry it names.
	Image string
	// Repository is the repository a built image is pushed to under
	// Options.Registry ("tasks/fix-the-cron"); empty means DefaultRepository.
	Repository string
}

// Image is an image ready to pull: a normalized reference and, when known, the digest
// of what it names.
type Image struct {
	// Ref is the full reference: registry, repository, tag and/or digest.
	Ref string
	// Digest is the manifest (or index) digest Ref names; "" for a reference not
	// resolved yet (Pull resolves it).
	Digest digest.Digest
	// Context is the build context's digest; "" for an image given by reference.
	Context digest.Digest
	// Cached says Build found the image in the registry and ran no builder.
	Cached bool
}

// New returns a Store. It only checks and allocates; the cache directory is made on
// first use.
func New(opts Options) (*Store, error) {
	cache := opts.CacheDir
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("images: no cache directory: %w", err)
		}
		cache = filepath.Join(dir, "gauntlet", "images")
	}
	cache, err := filepath.Abs(cache)
	if err != nil {
		return nil, fmt.Errorf("images: cache directory: %w", err)
	}
	for name, host := range map[string]string{"Registry": opts.Registry, "DockerHubMirror": opts.DockerHubMirror} {
		if host == "" {
			continue
		}
		if _, err := reference.ParseNormalizedNamed(host + "/x"); err != nil || strings.ContainsAny(host, "/@") {
			return nil, fmt.Errorf("images: %w: Options.%s %q is not a host[:port]", ErrInvalid, name, host)
		}
	}
	driver := opts.StorageDriver
	switch driver {
	case "":
		driver = "overlay"
	case "overlay", "vfs":
	default:
		return nil, fmt.Errorf("images: %w: Options.StorageDriver %q: want overlay or vfs", ErrInvalid, driver)
	}
	// The docker CLI's rule, resolved here rather than by its package, which reads
	// DOCKER_CONFIG once per process.
	docker := opts.DockerConfig
	if docker == "" {
		docker = os.Getenv("DOCKER_CONFIG")
	}
	if docker == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("images: no docker config directory: %w", err)
		}
		docker = filepath.Join(home, ".docker")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{
		cache:    cache,
		registry: opts.Registry,
		mirror:   opts.DockerHubMirror,
		buildah:  opts.Buildah,
		driver:   driver,
		docker:   docker,
		hosts:    opts.HostsDir,
		log:      log,
	}, nil
}

// CacheDir is the directory the Store keeps its state in.
func (s *Store) CacheDir() string { return s.cache }

// findBuildah returns the buildah executable, looked up once.
func (s *Store) findBuildah() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buildah != "" {
		if _, err := os.Stat(s.buildah); err != nil {
			return "", fmt.Errorf("%w: %v", ErrNotInstalled, err)
		}
		return s.buildah, nil
	}
	if p, err := exec.LookPath("buildah"); err == nil {
		s.buildah = p
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/buildah"); err == nil {
		s.buildah = "/usr/bin/buildah"
		return s.buildah, nil
	}
	return "", ErrNotInstalled
}

// normalize parses ref as the docker CLI does ("debian" is docker.io/library/debian:latest).
func normalize(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("%w: image reference %q: %v", ErrInvalid, ref, err)
	}
	return named.String(), nil
}

// contentStore returns Unpack's content store under the cache directory.
func (s *Store) contentStore() (content.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.content == nil {
		cs, err := local.NewStore(filepath.Join(s.cache, "content"))
		if err != nil {
			return nil, err
		}
		s.content = cs
	}
	return s.content, nil
}
