package scripts

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLauncherScripts runs registry.sh and containerd.sh as people do: start prints what
// callers need and the server answers, a second start prints the same and starts nothing
// more, status says running then stopped (exit 3), stop stops it, and a bad command is
// refused with the usage (exit 2).
func TestLauncherScripts(t *testing.T) {
	for _, c := range []struct {
		script string
		env    []string
		check  func(t *testing.T, ready string)
	}{
		{"registry.sh", []string{"GAUNTLET_REGISTRY_PORT=0"}, func(t *testing.T, addr string) {
			resp, err := http.Get("http://" + addr + "/v2/")
			if err != nil {
				t.Fatalf("the registry at %q does not answer: %v", addr, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /v2/ = %s, want 200", resp.Status)
			}
		}},
		{"containerd.sh", []string{"GAUNTLET_CONTAINERD_TMPFS=0"}, func(t *testing.T, socket string) {
			if fi, err := os.Stat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
				t.Fatalf("containerd's socket %q: %v (mode %v)", socket, err, fi)
			}
		}},
	} {
		t.Run(c.script, func(t *testing.T) {
			dir := t.TempDir()
			run := func(args ...string) (string, int) {
				t.Helper()
				cmd := exec.Command("bash", append([]string{filepath.Join("scripts", c.script)}, args...)...)
				cmd.Dir = ".."
				cmd.Env = append(os.Environ(), c.env...)
				out, err := cmd.Output()
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					return string(out), exit.ExitCode()
				}
				if err != nil {
					t.Fatalf("%s %v: %v", c.script, args, err)
				}
				return strings.TrimSpace(string(out)), 0
			}
			t.Cleanup(func() { run("stop", dir) })
			ready, code := run("start", dir)
			if code != 0 || ready == "" {
				t.Fatalf("start: exit %d, printed %q; launcher log: %s", code, ready, readFile(filepath.Join(dir, "launcher.log")))
			}
			c.check(t, ready)
			pid := readFile(filepath.Join(dir, "launcher.pid"))
			if again, code := run("start", dir); code != 0 || again != ready {
				t.Fatalf("second start: exit %d, printed %q; want 0 and %q", code, again, ready)
			}
			if p := readFile(filepath.Join(dir, "launcher.pid")); p != pid {
				t.Fatalf("a second start started another launcher: pid %s, then %s", pid, p)
			}
			if st, code := run("status", dir); code != 0 || st != "running: "+ready {
				t.Fatalf("status: exit %d, %q", code, st)
			}
			if _, code := run("stop", dir); code != 0 {
				t.Fatalf("stop: exit %d", code)
			}
			if st, code := run("status", dir); code != 3 || strings.TrimSpace(st) != "stopped" {
				t.Fatalf("status after stop: exit %d, %q; want 3, stopped", code, st)
			}
			if _, code := run("restart", dir); code != 2 {
				t.Fatalf("a bad command: exit %d, want 2", code)
			}
		})
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}
