// Package imagestest gives a test a real local registry that already serves gauntlet's
// Debian base image, so the test can build and pull task images with no internet
// registry. The base image comes from scripts/base-image.sh, the script people run,
// which builds it once from Debian's packages and caches it (about a minute cold;
// seconds when cached). A test that cannot get it fails with the reason (a tool
// missing, say); it never skips.
package imagestest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal"
	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal/registrytest"
)

// BaseRepository is the base image's name in the registry, with its tag.
const BaseRepository = "debian:bookworm"

// Registry starts a registry for the test (package registrytest) and pushes the
// Debian base image to it; FROM <registry>/debian:bookworm (see Base) then works in a
// Dockerfile.
func Registry(t testing.TB) *registrylocal.Server {
	t.Helper()
	reg := registrytest.Start(t)
	script := filepath.Join(repoRoot(t), "scripts", "base-image.sh")
	out, err := exec.Command(script, "--push", reg.Addr()).CombinedOutput()
	if err != nil {
		t.Fatalf("imagestest: %s --push %s: %v\n%s", script, reg.Addr(), err, out)
	}
	return reg
}

// Base is the base image's reference in reg.
func Base(reg *registrylocal.Server) string { return reg.Addr() + "/" + BaseRepository }

// repoRoot is the repository's root, found from this file's location.
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("imagestest: cannot locate the repository")
	}
	root := filepath.Dir(file)
	for range 3 { // pkg/images/imagestest
		root = filepath.Dir(root)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("imagestest: %s is not the repository root: %v", root, err)
	}
	return root
}
