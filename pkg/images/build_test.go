package images_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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
	t.Logf("cold run in all: %v", time.Since(begin).Round(time.Second))
}

// runIn runs args in a new container of img and returns its output; the command
// must exit 0.
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
	var out bytes.Buffer
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, &out)))
	if err != nil {
		t.Fatal(err)
	}
	defer task.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
	exit, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-exit:
		if st.ExitCode() != 0 {
			t.Fatalf("%v exited %d:\n%s", args, st.ExitCode(), out.String())
		}
	case <-ctx.Done():
		_ = task.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		t.Fatalf("%v did not finish: %v", args, ctx.Err())
	}
	// The streams are copied after the exit; close the IO to flush them.
	if io := task.IO(); io != nil {
		io.Wait()
	}
	return out.String()
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
