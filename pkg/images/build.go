package images

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// tagPrefix starts the tag of a built image; the context digest follows.
const tagPrefix = "ctx-"

// Prepare returns the image of src: for a build context, Build's; for a reference,
// the normalized reference, not resolved yet (Pull and Unpack resolve it).
func (s *Store) Prepare(ctx context.Context, src Source) (Image, error) {
	switch {
	case src.Context != "" && src.Image != "":
		return Image{}, fmt.Errorf("prepare image: %w: both a build context (%s) and an image reference (%s)", ErrInvalid, src.Context, src.Image)
	case src.Image != "":
		ref, err := normalize(src.Image)
		if err != nil {
			return Image{}, fmt.Errorf("prepare image: %w", err)
		}
		return Image{Ref: ref}, nil
	case src.Context != "":
		return s.Build(ctx, src)
	default:
		return Image{}, fmt.Errorf("prepare image: %w: neither a build context nor an image reference", ErrInvalid)
	}
}

// Build builds src's context with buildah and pushes the image to Options.Registry as
// Registry/Repository:ctx-<hex of the context digest>, unless the registry has that tag
// already: then it returns at once with Cached set and runs no builder (the cost of a
// hit is digesting the context and one HEAD request). The registry is the cache, so
// every machine using it shares the builds. RUN steps run with buildah's chroot
// isolation and the host's network; buildah's own layer cache (under CacheDir) makes a
// rebuild after a small change cheap. ctx bounds the build (a task's build timeout):
// when it ends, the builder's whole process group is killed.
func (s *Store) Build(ctx context.Context, src Source) (Image, error) {
	ctx = quiet(ctx)
	if src.Context == "" || src.Image != "" {
		return Image{}, fmt.Errorf("build image: %w: Build takes a build context and no image reference", ErrInvalid)
	}
	if s.registry == "" {
		return Image{}, fmt.Errorf("build image %s: %w: no Options.Registry to push to", src.Context, ErrInvalid)
	}
	// The context's own path may be a symlink (a dataset linking a shared
	// environment): the build reads what it points to, and so does the digest.
	dir, err := filepath.EvalSymlinks(src.Context)
	if err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w: the build context: %v", src.Context, ErrInvalid, err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return Image{}, fmt.Errorf("build image %s: %w: the build context is not a directory", src.Context, ErrInvalid)
	}
	dockerfile := src.Dockerfile
	if dockerfile == "" {
		dockerfile = "Dockerfile"
	}
	if !filepath.IsLocal(dockerfile) {
		return Image{}, fmt.Errorf("build image %s: %w: Dockerfile %q is not inside the build context", src.Context, ErrInvalid, dockerfile)
	}
	if st, err := os.Stat(filepath.Join(dir, dockerfile)); err != nil || !st.Mode().IsRegular() {
		return Image{}, fmt.Errorf("build image %s: %w: no file %s in the build context", src.Context, ErrInvalid, dockerfile)
	}
	repo := src.Repository
	if repo == "" {
		repo = DefaultRepository
	}
	key, err := ContextDigest(dir, dockerfile)
	if err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	ref := s.registry + "/" + repo + ":" + tagPrefix + key.Encoded()
	if _, err := reference.ParseNormalizedNamed(ref); err != nil {
		return Image{}, fmt.Errorf("build image %s: %w: repository %q: %v", src.Context, ErrInvalid, repo, err)
	}
	img := Image{Ref: ref, Context: key}

	if d, err := s.lookup(ctx, ref); err == nil {
		img.Digest, img.Cached = d, true
		return img, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Image{}, fmt.Errorf("build image %s: %w", src.Context, err)
	}

	// One build per context at a time, in this process and across processes: each
	// flock opens the lock file anew, and flock locks of two open files conflict
	// even within one process.
	unlock, err := s.flock(ctx, "build-"+key.Encoded())
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", src.Context, err)
	}
	defer unlock()
	if d, err := s.lookup(ctx, ref); err == nil { // built meanwhile
		img.Digest, img.Cached = d, true
		return img, nil
	}

	begin := time.Now()
	d, err := s.buildAndPush(ctx, dir, dockerfile, ref, key)
	if err != nil {
		return Image{}, fmt.Errorf("build image %s: %w", src.Context, err)
	}
	img.Digest = d
	s.log.Info("image built", "ref", ref, "digest", d, "took", time.Since(begin).Round(time.Millisecond))
	return img, nil
}

// lookup resolves ref in its registry: the digest it names, or ErrNotFound.
func (s *Store) lookup(ctx context.Context, ref string) (digest.Digest, error) {
	_, desc, err := s.resolver(ctx).Resolve(ctx, ref)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return "", fmt.Errorf("resolve %s: %w", ref, ErrNotFound)
		}
		return "", fmt.Errorf("resolve %s: %w", ref, err)
	}
	return desc.Digest, nil
}

// buildAndPush runs buildah bud then buildah push, their output in one log file under
// CacheDir/logs, and returns the pushed manifest's digest.
func (s *Store) buildAndPush(ctx context.Context, dir, dockerfile, ref string, key digest.Digest) (digest.Digest, error) {
	bin, err := s.findBuildah()
	if err != nil {
		return "", err
	}
	conf, err := s.registriesConf()
	if err != nil {
		return "", err
	}
	logs := filepath.Join(s.cache, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return "", err
	}
	logPath := filepath.Join(logs, key.Encoded()+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logf.Close()

	global := []string{
		"--root", filepath.Join(s.cache, "buildah", "root"),
		"--runroot", filepath.Join(s.cache, "buildah", "run"),
		"--storage-driver", s.driver,
		"--registries-conf", conf,
	}
	var auth []string
	if f := s.authFile(); f != "" {
		auth = []string{"--authfile", f}
	}
	bud := append(append([]string{}, global...), "bud",
		"--isolation", "chroot",
		"--layers",
		"--force-rm", // remove the working container of a failed step too
		"--format", "oci",
		"--file", filepath.Join(dir, dockerfile),
		"--tag", ref,
		"--label", "io.gauntlet.build-context="+key.String())
	bud = append(append(bud, auth...), dir)
	if err := s.run(ctx, bin, logf, logPath, bud); err != nil {
		return "", fmt.Errorf("buildah bud: %w", err)
	}

	digestFile := filepath.Join(logs, key.Encoded()+".digest")
	defer os.Remove(digestFile)
	push := append(append([]string{}, global...), "push", "--digestfile", digestFile)
	if isLoopback(s.registry) {
		push = append(push, "--tls-verify=false")
	}
	push = append(append(push, auth...), ref, "docker://"+ref)
	if err := s.run(ctx, bin, logf, logPath, push); err != nil {
		return "", fmt.Errorf("buildah push to %s: %w", s.registry, err)
	}
	b, err := os.ReadFile(digestFile)
	if err != nil {
		return "", fmt.Errorf("buildah push: read its digest file: %w", err)
	}
	d, err := digest.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("buildah push: its digest file: %w", err)
	}
	return d, nil
}

// run runs buildah with args, its output appended to logf; a failure quotes the end
// of the log. The builder and whatever its RUN steps start share a process group of
// their own, killed as a whole when ctx ends, and a mount namespace of their own: a
// build that fails or is killed leaves its working container mounted (buildah unmounts
// only on success), and in a private namespace those mounts end with the builder's
// processes instead of staying in the host's mount table, where they would pin the
// cache directory.
func (s *Store) run(ctx context.Context, bin string, logf *os.File, logPath string, args []string) error {
	at := childproc.FileSize(logPath)
	fmt.Fprintf(logf, "+ buildah %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		// The group got SIGKILL; its members may take a moment to die. A build
		// that returns has nothing left running.
		waitGroupGone(cmd.Process.Pid, 10*time.Second)
		return fmt.Errorf("%w: stopped: %w (log %s)", ErrBuild, context.Cause(ctx), logPath)
	}
	return fmt.Errorf("%w: %v (log %s); its end:\n%s", ErrBuild, err, logPath, childproc.Tail(logPath, at))
}

// waitGroupGone waits, up to bound, until no live (non-zombie) process is left in
// process group pgid.
func waitGroupGone(pgid int, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for groupAlive(pgid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// groupAlive tells whether a process of group pgid still runs (zombies excepted:
// they are dead, waiting for a parent to reap them).
func groupAlive(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	want := strconv.Itoa(pgid)
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces; read after its ')'.
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(st[i+1:])
		if len(f) >= 3 && f[2] == want && f[0] != "Z" {
			return true
		}
	}
	return false
}

// registriesConf writes the registries.conf buildah reads (containers-registries.conf
// format): unqualified names ("FROM debian") mean Docker Hub, as with docker build;
// Docker Hub goes through Options.DockerHubMirror first when set; loopback registries
// are reached over plain HTTP. The file is named by its content, so Stores with other
// registries over the same CacheDir do not collide.
func (s *Store) registriesConf() (string, error) {
	conf := "unqualified-search-registries = [\"docker.io\"]\nshort-name-mode = \"permissive\"\n"
	if s.mirror != "" {
		conf += fmt.Sprintf("\n[[registry]]\nprefix = \"docker.io\"\nlocation = \"docker.io\"\n\n[[registry.mirror]]\nlocation = %q\ninsecure = %t\n", s.mirror, isLoopback(s.mirror))
	}
	if isLoopback(s.registry) && s.registry != s.mirror {
		conf += fmt.Sprintf("\n[[registry]]\nlocation = %q\ninsecure = true\n", s.registry)
	}
	if isLoopback(s.mirror) {
		conf += fmt.Sprintf("\n[[registry]]\nlocation = %q\ninsecure = true\n", s.mirror)
	}
	sum := sha256.Sum256([]byte(conf))
	dir := filepath.Join(s.cache, "buildah")
	path := filepath.Join(dir, fmt.Sprintf("registries-%x.conf", sum[:8]))
	if fileExists(path) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// A temporary file of its own per writer: builds started at once in one process
	// each write it, and the last rename wins with the same content.
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return "", err
	}
	_, werr := f.WriteString(conf)
	if err := errors.Join(werr, f.Chmod(0o644), f.Close()); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("registries.conf: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("registries.conf: %w", err)
	}
	return path, nil
}

// flock takes the exclusive file lock CacheDir/locks/name, polling while another
// process holds it until ctx ends, and returns its release.
func (s *Store) flock(ctx context.Context, name string) (func(), error) {
	dir := filepath.Join(s.cache, "locks")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for lock %s: %w", f.Name(), context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// isLoopback tells whether host (host[:port]) is localhost or a loopback address.
func isLoopback(host string) bool { return docker.IsLocalhost(host) }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
