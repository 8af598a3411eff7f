package runtimes

import (
	"strings"
	"testing"
)

// TestHostsFlag: --sandbox.hosts takes NAME=HOST:PORT entries, names lower-case host
// names, each once.
func TestHostsFlag(t *testing.T) {
	var h HostsFlag
	if err := h.Set("releases.example.test=127.0.0.1:8080, pypi.org=mirror:3141"); err != nil {
		t.Fatal(err)
	}
	if err := h.Set("files.example.test=[::1]:80"); err != nil {
		t.Fatal(err)
	}
	if got := h.String(); got != "files.example.test=[::1]:80,pypi.org=mirror:3141,releases.example.test=127.0.0.1:8080" {
		t.Errorf("String() = %q", got)
	}
	for _, bad := range []string{"PyPI.org=a:1", "pypi.org=mirror", "pypi.org", "10.0.0.1=a:1", "pypi.org=a:1", "x.org=:80"} {
		if err := h.Set(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("Set(%q) = %v, want an error naming it", bad, err)
		}
	}
}
