package images_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/images"
	"github.com/gauntlet-rl/gauntlet/pkg/images/imagestest"
	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal/registrytest"
)

// TestBuildAptImageThroughTheRegistryIntoContainerd is the whole path a task's image
// takes, from nothing: a Dockerfile FROM the local registry's Debian base that
// apt-get installs a package is built by buildah (fresh storage, so apt really runs),
// pushed to the registry, pulled into a fresh containerd, and a container of it
// runs the package. Building again is a cache hit that runs no builder, and the
// same image unpacks into a directory for the process runtime.
func TestBuildAptImageThroughTheRegistryIntoContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image with buildah and runs containerd; -short runs unit tests only")
	}
	begin := time.Now()
	reg := imagestest.Registry(t)
	t.Logf("registry with the base image: %v", time.Since(begin).Round(time.Millisecond))
	ctrd := ctrdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "imagestest")

	task := t.TempDir()
	dockerfile := "FROM " + imagestest.Base(reg) + "\n" +
		"RUN apt-get update && apt-get install -y --no-install-recommends hello && rm -rf /var/lib/apt/lists/*\n" +
		"COPY greeting.txt /etc/greeting.txt\n"
	writeFile(t, filepath.Join(task, "Dockerfile"), dockerfile)
	writeFile(t, filepath.Join(task, "greeting.txt"), "from the build context\n")

	cache := t.TempDir()
	store, err := images.New(images.Options{CacheDir: cache, Registry: reg.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	src := images.Source{Context: task, Repository: "tasks/hello"}
	buildBegin := time.Now()
	img, err := store.Prepare(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cold build and push: %v (%s)", time.Since(buildBegin).Round(time.Millisecond), img.Ref)
	if img.Cached || img.Digest == "" || !strings.HasPrefix(img.Ref, reg.Addr()+"/tasks/hello:ctx-") {
		t.Fatalf("cold build gave %+v", img)
	}

	c, err := ctrd.Client("imagestest")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if list, err := c.ListImages(ctx); err != nil || len(list) != 0 {
		t.Fatalf("containerd's image store is not empty at the start: %d images, %v", len(list), err)
	}
	pullBegin := time.Now()
	cimg, err := store.Pull(ctx, c, img, "overlayfs")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pull into containerd: %v", time.Since(pullBegin).Round(time.Millisecond))
	if cimg.Target().Digest != img.Digest {
		t.Fatalf("containerd holds %s, the registry %s", cimg.Target().Digest, img.Digest)
	}

	out := runIn(ctx, t, c, cimg, "sh", "-c", "hello && dpkg-query -W -f='${Status}\n' hello && cat /etc/greeting.txt")
	for _, want := range []string{"Hello, world!", "install ok installed", "from the build context"} {
		if !strings.Contains(out, want) {
			t.Errorf("the container's output lacks %q:\n%s", want, out)
		}
	}

	// A rebuild of the same context, by this Store or a new one over another cache
	// (another machine), finds the image in the registry and runs no builder: a
	// Store whose buildah does not exist proves it.
	for _, o := range []images.Options{
		{CacheDir: cache, Registry: reg.Addr()},
		{CacheDir: t.TempDir(), Registry: reg.Addr(), Buildah: filepath.Join(t.TempDir(), "no-buildah")},
	} {
		s, err := images.New(o)
		if err != nil {
			t.Fatal(err)
		}
		hitBegin := time.Now()
		again, err := s.Build(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("cache hit: %v", time.Since(hitBegin))
		if !again.Cached || again.Digest != img.Digest || again.Ref != img.Ref {
			t.Fatalf("rebuild gave %+v, want a cache hit on %+v", again, img)
		}
	}
	// So does a pull of an image containerd holds.
	if _, err := store.Pull(ctx, c, img, "overlayfs"); err != nil {
		t.Fatal(err)
	}

	// A changed context is another image.
	writeFile(t, filepath.Join(task, "greeting.txt"), "changed\n")
	noBuilder, err := images.New(images.Options{CacheDir: t.TempDir(), Registry: reg.Addr(), Buildah: filepath.Join(t.TempDir(), "no-buildah")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noBuilder.Build(ctx, src); err == nil || !strings.Contains(err.Error(), "buildah") {
		t.Fatalf("a changed context did not ask for the builder: %v", err)
	}

	// The process runtime's view: the same image as a directory.
	unpackBegin := time.Now()
	dir, err := store.Unpack(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unpack for the process runtime: %v", time.Since(unpackBegin).Round(time.Millisecond))
	for _, p := range []string{"usr/bin/hello", "usr/bin/apt-get", "etc/debian_version"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("unpacked image lacks %s: %v", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "etc/greeting.txt")); err != nil || string(b) != "from the build context\n" {
		t.Errorf("unpacked /etc/greeting.txt = %q, %v", b, err)
	}
	if again, err := store.Unpack(ctx, img); err != nil || again != dir {
		t.Errorf("second unpack = %q, %v; want the cached %q", again, err, dir)
	}
	// As the process runtime uses it: the lower layer of an overlay, which runs.
	if out := runInOverlay(t, dir, "/usr/bin/hello"); !strings.Contains(out, "Hello, world!") {
		t.Errorf("hello in an overlay over the unpacked image said %q", out)
	}
	t.Logf("cold run in all: %v", time.Since(begin).Round(time.Second))
}

// runIn runs args in a new container of img and returns its output; the command
// must exit 0. The shim writes the output to a file (cio.LogFile), read once the
// task is deleted, when the shim has written all of it.
func runIn(ctx context.Context, t *testing.T, c *client.Client, img client.Image, args ...string) string {
	t.Helper()
	ctr, err := c.NewContainer(ctx, "imagestest-run",
		client.WithImage(img),
		client.WithNewSnapshot("imagestest-run", img),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(args...)))
	if err != nil {
		t.Fatal(err)
	}
	defer ctr.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup)
	logPath := filepath.Join(t.TempDir(), "out.log")
	task, err := ctr.NewTask(ctx, cio.LogFile(logPath))
	if err != nil {
		t.Fatal(err)
	}
	exit, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var code uint32
	select {
	case st := <-exit:
		code = st.ExitCode()
	case <-ctx.Done():
		_ = task.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		t.Fatalf("%v did not finish: %v", args, ctx.Err())
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("%v exited %d:\n%s", args, code, out)
	}
	return string(out)
}

// runInOverlay mounts an overlay with lower as its only lower layer (the process
// runtime's shape: the image below, a writable layer above), runs args chrooted into
// it and returns the output. The overlay is unmounted before it returns.
func runInOverlay(t *testing.T, lower string, args ...string) string {
	t.Helper()
	base := t.TempDir()
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
		t.Fatalf("mount an overlay over %s: %v", lower, err)
	}
	defer func() {
		if err := syscall.Unmount(merged, 0); err != nil {
			t.Errorf("unmount %s: %v", merged, err)
		}
	}()
	out, err := exec.Command("chroot", append([]string{merged}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("chroot %s %v: %v\n%s", merged, args, err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPrivateRegistryWithDockerConfigCredentials: a registry that asks for basic auth
// serves a Store only with the credentials of its docker config file, as `docker
// login` writes it, on every path: buildah's push, the cache lookup, containerd's pull
// and the unpack. Without them each fails saying the registry refused.
func TestPrivateRegistryWithDockerConfigCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image with buildah and runs containerd; -short runs unit tests only")
	}
	reg := registrytest.StartWithAuth(t, "alice", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "imagestest")

	task := t.TempDir()
	writeFile(t, filepath.Join(task, "Dockerfile"), "FROM scratch\nCOPY secret.txt /secret.txt\n")
	writeFile(t, filepath.Join(task, "secret.txt"), "only for alice\n")
	src := images.Source{Context: task, Repository: "private/task"}

	anonymous, err := images.New(images.Options{CacheDir: t.TempDir(), Registry: reg.Addr(), DockerConfig: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonymous.Build(ctx, src); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authoriz") {
		t.Fatalf("a build without credentials: %v, want an authorization error", err)
	}

	docker := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	writeFile(t, filepath.Join(docker, "config.json"), `{"auths":{"`+reg.Addr()+`":{"auth":"`+auth+`"}}}`)
	store, err := images.New(images.Options{CacheDir: t.TempDir(), Registry: reg.Addr(), DockerConfig: docker})
	if err != nil {
		t.Fatal(err)
	}
	img, err := store.Build(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := store.Build(ctx, src); err != nil || !again.Cached {
		t.Fatalf("rebuild: %+v, %v; want a cache hit", again, err)
	}

	ctrd := ctrdtest.Start(t)
	c, err := ctrd.Client("imagestest")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ref := images.Image{Ref: img.Ref} // as a task naming the image would give it
	if _, err := anonymous.Pull(ctx, c, ref, "overlayfs"); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authoriz") {
		t.Fatalf("a pull without credentials: %v, want an authorization error", err)
	}
	cimg, err := store.Pull(ctx, c, ref, "overlayfs")
	if err != nil {
		t.Fatal(err)
	}
	if cimg.Target().Digest != img.Digest {
		t.Fatalf("containerd holds %s, the registry %s", cimg.Target().Digest, img.Digest)
	}
	if _, err := anonymous.Unpack(ctx, ref); err == nil {
		t.Fatal("an unpack without credentials worked")
	}
	dir, err := store.Unpack(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "secret.txt")); err != nil || string(b) != "only for alice\n" {
		t.Fatalf("unpacked secret.txt = %q, %v", b, err)
	}
}

// TestBuildFailuresSayWhy: a failing RUN step is an ErrBuild quoting the builder's
// output; a build that outlives its context is stopped with every process it started.
func TestBuildFailuresSayWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images with buildah; -short runs unit tests only")
	}
	reg := imagestest.Registry(t)
	cache := t.TempDir()
	// A failing build must leave no mount under its cache; should one stay, it is
	// unmounted before the directory is removed, so the failure is reported once.
	t.Cleanup(func() {
		for _, m := range mountsUnder(cache) {
			syscall.Unmount(m, syscall.MNT_DETACH)
		}
	})
	store, err := images.New(images.Options{CacheDir: cache, Registry: reg.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	failing := t.TempDir()
	writeFile(t, filepath.Join(failing, "Dockerfile"), "FROM "+imagestest.Base(reg)+"\nRUN echo the-step-says-why && exit 3\n")
	_, err = store.Build(ctx, images.Source{Context: failing})
	if !errors.Is(err, images.ErrBuild) || !strings.Contains(err.Error(), "the-step-says-why") {
		t.Fatalf("a failing RUN: %v, want ErrBuild quoting the step's output", err)
	}

	slow := t.TempDir()
	writeFile(t, filepath.Join(slow, "Dockerfile"), "FROM "+imagestest.Base(reg)+"\nRUN sleep 613\n")
	bctx, bcancel := context.WithTimeout(ctx, 20*time.Second)
	defer bcancel()
	_, err = store.Build(bctx, images.Source{Context: slow})
	if !errors.Is(err, images.ErrBuild) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a build past its deadline: %v, want ErrBuild and the deadline", err)
	}
	// Every process of the build is gone: the RUN step's sleep included.
	if pids := processesRunning("sleep\x00613"); len(pids) != 0 {
		t.Fatalf("the stopped build left processes: %v", pids)
	}
	// Neither build left a mount in the host's mount table.
	if ms := mountsUnder(cache); len(ms) != 0 {
		t.Fatalf("the failed builds left mounts: %v", ms)
	}
}

// mountsUnder lists the mount points at or under dir in this process's mount
// namespace, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	slices.Reverse(out)
	return out
}

// processesRunning lists the pids whose command line contains cmdline (arguments
// separated by NUL).
func processesRunning(cmdline string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), cmdline) {
			out = append(out, e.Name())
		}
	}
	return out
}

// BenchmarkBuild measures a build cache hit (the context digested, the registry
// asked for its tag, no builder run) against a cold build and push of the same small
// context (FROM scratch, one COPY) with buildah, reported as cold-ms.
//
//	nice -n 19 go test -run '^$' -bench BenchmarkBuild -benchtime 200x ./pkg/images/
func BenchmarkBuild(b *testing.B) {
	reg := registrytest.Start(b)
	store, err := images.New(images.Options{CacheDir: b.TempDir(), Registry: reg.Addr()})
	if err != nil {
		b.Fatal(err)
	}
	task := b.TempDir()
	if err := os.WriteFile(filepath.Join(task, "Dockerfile"), []byte("FROM scratch\nCOPY data /data\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(task, "data"), bytes.Repeat([]byte("gauntlet\n"), 1<<14), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	src := images.Source{Context: task}
	begin := time.Now()
	if img, err := store.Build(ctx, src); err != nil || img.Cached {
		b.Fatalf("cold build: %+v, %v", img, err)
	}
	cold := time.Since(begin)
	for b.Loop() {
		if img, err := store.Build(ctx, src); err != nil || !img.Cached {
			b.Fatalf("cache hit: %+v, %v", img, err)
		}
	}
	b.ReportMetric(float64(cold.Milliseconds()), "cold-ms")
}

// TestDockerHubNamesThroughTheMirror: with the local registry as the Docker Hub
// mirror, a task of the in-repo dataset, whose Dockerfile says FROM
// debian:bookworm-slim, builds unchanged here (no Docker Hub reachable) and runs in
// containerd; a task naming debian:bookworm-slim as its image pulls it the same way.
func TestDockerHubNamesThroughTheMirror(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image with buildah and runs containerd; -short runs unit tests only")
	}
	env := datasetEnvironmentWithoutApt(t)
	reg := imagestest.Registry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, "imagestest")
	store, err := images.New(images.Options{CacheDir: t.TempDir(), Registry: reg.Addr(), DockerHubMirror: reg.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	img, err := store.Prepare(ctx, images.Source{Context: env, Repository: "tasks/dataset"})
	if err != nil {
		t.Fatal(err)
	}
	ctrd := ctrdtest.Start(t)
	c, err := ctrd.Client("imagestest")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cimg, err := store.Pull(ctx, c, img, "overlayfs")
	if err != nil {
		t.Fatal(err)
	}
	if out := runIn(ctx, t, c, cimg, "sh", "-c", "cat /etc/debian_version && ls /app"); !strings.HasPrefix(out, "12.") {
		t.Errorf("the dataset task's image is not bookworm: %q", out)
	}

	ref, err := store.Prepare(ctx, images.Source{Image: "debian:bookworm-slim"})
	if err != nil {
		t.Fatal(err)
	}
	slim, err := store.Pull(ctx, c, ref, "overlayfs")
	if err != nil {
		t.Fatal(err)
	}
	if slim.Name() != "docker.io/library/debian:bookworm-slim" {
		t.Errorf("pulled %s", slim.Name())
	}
}

// datasetEnvironmentWithoutApt finds an environment/ of the in-repo dataset whose
// Dockerfile builds FROM debian:bookworm-slim without apt-get (quick to build).
func datasetEnvironmentWithoutApt(t *testing.T) string {
	t.Helper()
	dfs, err := filepath.Glob(filepath.Join("..", "..", "datasets", "*", "*", "*", "environment", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, df := range dfs {
		b, err := os.ReadFile(df)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(b), "FROM debian:bookworm-slim\n") && !strings.Contains(string(b), "apt-get") {
			return filepath.Dir(df)
		}
	}
	t.Fatalf("no Dockerfile FROM debian:bookworm-slim without apt-get among %d in datasets/", len(dfs))
	return ""
}
