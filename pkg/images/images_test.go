package images

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func write(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// sampleContext makes a build context with a file, a nested file and a symlink.
func sampleContext(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "Dockerfile"), "FROM scratch\nCOPY . /\n", 0o644)
	write(t, filepath.Join(dir, "app", "run.sh"), "#!/bin/sh\necho hi\n", 0o755)
	if err := os.Symlink("app/run.sh", filepath.Join(dir, "run")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestContextDigestSeesWhatABuildSees(t *testing.T) {
	base := sampleContext(t)
	want, err := ContextDigest(base, "Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := ContextDigest(base, "Dockerfile"); got != want {
		t.Fatalf("digest not stable: %s then %s", want, got)
	}
	// The same content elsewhere, written later: same digest.
	other := sampleContext(t)
	if got, _ := ContextDigest(other, "Dockerfile"); got != want {
		t.Errorf("a copy of the context has another digest: %s, want %s", got, want)
	}
	changes := map[string]func(dir string){
		"file content":   func(d string) { write(t, filepath.Join(d, "app", "run.sh"), "#!/bin/sh\necho ho\n", 0o755) },
		"file mode":      func(d string) { os.Chmod(filepath.Join(d, "app", "run.sh"), 0o644) },
		"new empty file": func(d string) { write(t, filepath.Join(d, "app", "empty"), "", 0o644) },
		"new empty dir":  func(d string) { os.Mkdir(filepath.Join(d, "empty"), 0o755) },
		"symlink target": func(d string) {
			os.Remove(filepath.Join(d, "run"))
			os.Symlink("app/other.sh", filepath.Join(d, "run"))
		},
		"rename": func(d string) { os.Rename(filepath.Join(d, "app", "run.sh"), filepath.Join(d, "app", "run2.sh")) },
		"dockerfile": func(d string) {
			write(t, filepath.Join(d, "Dockerfile"), "FROM scratch\nCOPY app /\n", 0o644)
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			d := sampleContext(t)
			change(d)
			got, err := ContextDigest(d, "Dockerfile")
			if err != nil {
				t.Fatal(err)
			}
			if got == want {
				t.Errorf("a change of %s kept the digest", name)
			}
		})
	}
	if got, _ := ContextDigest(base, "app/Dockerfile"); got == want {
		t.Error("another Dockerfile path kept the digest")
	}
}

func TestContextDigestRefusesSpecialFiles(t *testing.T) {
	dir := sampleContext(t)
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ContextDigest(dir, "Dockerfile")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "pipe") {
		t.Fatalf("err = %v, want ErrInvalid naming the fifo", err)
	}
}

func TestPrepareRefusesBadSources(t *testing.T) {
	s, err := New(Options{CacheDir: t.TempDir(), Registry: "127.0.0.1:5000"})
	if err != nil {
		t.Fatal(err)
	}
	noDockerfile := t.TempDir()
	cases := map[string]struct {
		src  Source
		want string
	}{
		"neither":            {Source{}, "neither"},
		"both":               {Source{Context: sampleContext(t), Image: "debian"}, "both"},
		"bad reference":      {Source{Image: "Not A Ref"}, "Not A Ref"},
		"no dockerfile":      {Source{Context: noDockerfile}, "no file Dockerfile"},
		"dockerfile outside": {Source{Context: sampleContext(t), Dockerfile: "../Dockerfile"}, "not inside"},
		"context missing":    {Source{Context: filepath.Join(noDockerfile, "nope")}, "nope"},
		"context a file":     {Source{Context: filepath.Join(sampleContext(t), "Dockerfile")}, "not a directory"},
		"bad repository":     {Source{Context: sampleContext(t), Repository: "Upper/Case"}, "Upper/Case"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := s.Prepare(context.Background(), tc.src)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}

func TestPrepareNormalizesReferences(t *testing.T) {
	s, err := New(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"debian":                         "docker.io/library/debian:latest",
		"python:3.12-slim":               "docker.io/library/python:3.12-slim",
		"127.0.0.1:5000/tasks/x:ctx-abc": "127.0.0.1:5000/tasks/x:ctx-abc",
	} {
		img, err := s.Prepare(context.Background(), Source{Image: in})
		if err != nil || img.Ref != want || img.Digest != "" || img.Cached {
			t.Errorf("Prepare(%q) = %+v, %v; want ref %q", in, img, err, want)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"registry with a path": {Registry: "127.0.0.1:5000/x"},
		"mirror with a path":   {DockerHubMirror: "mirror.example/x"},
		"storage driver":       {StorageDriver: "btrfs"},
	} {
		if _, err := New(o); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := New(Options{CacheDir: t.TempDir()}); err != nil {
		t.Errorf("New without a registry (pull only): %v", err)
	}
}

func TestBuildWithoutARegistry(t *testing.T) {
	s, err := New(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Build(context.Background(), Source{Context: sampleContext(t)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
}

// The docker config file's credentials, as `docker login` writes them, reach the
// resolver; a host without an entry gets none.
func TestCredentialsFromTheDockerConfig(t *testing.T) {
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	write(t, filepath.Join(dir, "config.json"), `{"auths":{
		"registry.example.com": {"auth": "`+auth+`"},
		"tokens.example.com": {"identitytoken": "tok"},
		"https://index.docker.io/v1/": {"auth": "`+base64.StdEncoding.EncodeToString([]byte("hub:pw"))+`"}
	}}`, 0o600)
	s, err := New(Options{CacheDir: t.TempDir(), DockerConfig: dir})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string][2]string{
		"registry.example.com": {"alice", "s3cret"},
		"tokens.example.com":   {"", "tok"},
		"registry-1.docker.io": {"hub", "pw"},
		"elsewhere.example":    {"", ""},
	} {
		u, p, err := s.credentials(host)
		if err != nil || u != want[0] || p != want[1] {
			t.Errorf("credentials(%s) = %q, %q, %v; want %q, %q", host, u, p, err, want[0], want[1])
		}
	}
	if got := s.authFile(); got != filepath.Join(dir, "config.json") {
		t.Errorf("authFile = %q", got)
	}
	// DOCKER_CONFIG is the default, as for the docker CLI.
	t.Setenv("DOCKER_CONFIG", dir)
	s2, _ := New(Options{CacheDir: t.TempDir()})
	if u, _, err := s2.credentials("registry.example.com"); err != nil || u != "alice" {
		t.Errorf("with DOCKER_CONFIG: user %q, %v", u, err)
	}
}

func TestCredentialsFromABrokenDockerConfig(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config.json"), `{"auths": [`, 0o600)
	s, err := New(Options{CacheDir: t.TempDir(), DockerConfig: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.credentials("registry.example.com"); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("err = %v, want one naming %s", err, dir)
	}
}

// Builds of one context wait for each other within a process too: the file lock
// conflicts between two callers of one Store, and a waiter gives up with its context.
func TestFlockExcludesWithinAProcess(t *testing.T) {
	s, err := New(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := s.flock(context.Background(), "build-x")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.flock(ctx, "build-x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second lock while the first is held: %v, want the deadline", err)
	}
	other, err := s.flock(context.Background(), "build-y")
	if err != nil {
		t.Fatalf("another name's lock: %v", err)
	}
	other()
	unlock()
	again, err := s.flock(context.Background(), "build-x")
	if err != nil {
		t.Fatalf("the lock after its release: %v", err)
	}
	again()
}

// A credential helper named by credHelpers (or credsStore) answers for its registry,
// through the docker-credential-* protocol (the server on stdin, JSON out).
func TestCredentialsFromACredentialHelper(t *testing.T) {
	bin := t.TempDir()
	write(t, filepath.Join(bin, "docker-credential-gauntlettest"), `#!/bin/sh
[ "$1" = get ] || exit 1
read server
echo "{\"ServerURL\":\"$server\",\"Username\":\"helped\",\"Secret\":\"from-$server\"}"
`, 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config.json"), `{"credHelpers":{"helped.example.com":"gauntlettest"}}`, 0o600)
	s, err := New(Options{CacheDir: t.TempDir(), DockerConfig: dir})
	if err != nil {
		t.Fatal(err)
	}
	u, p, err := s.credentials("helped.example.com")
	if err != nil || u != "helped" || p != "from-helped.example.com" {
		t.Fatalf("credentials = %q, %q, %v; want the helper's", u, p, err)
	}
	if u, p, err := s.credentials("other.example.com"); err != nil || u != "" || p != "" {
		t.Fatalf("a registry without a helper: %q, %q, %v; want none", u, p, err)
	}
}

// TestRegistriesConfConcurrently: builds started at once in one process (a run's first
// episodes over several task images) all get the registries.conf, written once. Each
// wrote it through the same temporary name (the file's plus the pid), so one's rename
// found the other's file gone: "rename ...registries-....conf.PID.tmp: no such file"
// failed an episode's image build in CI.
func TestRegistriesConfConcurrently(t *testing.T) {
	for round := range 20 {
		s, err := New(Options{CacheDir: t.TempDir(), Registry: "127.0.0.1:5000", DockerHubMirror: "127.0.0.1:5000"})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 8)
		for range 8 {
			go func() {
				path, err := s.registriesConf()
				if err == nil {
					_, err = os.Stat(path)
				}
				errs <- err
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		left, _ := filepath.Glob(filepath.Join(s.cache, "buildah", "*.tmp*"))
		if len(left) > 0 {
			t.Fatalf("round %d: temporary files left: %v", round, left)
		}
	}
}
