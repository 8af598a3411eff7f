package runtimes

import (
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// TestHostsFlag: --sandbox.hosts takes NAME=HOST:PORT (port 80 of NAME) and
// NAME:PORT=HOST:PORT entries, names lower-case host names, each port once, and names
// the entry in every error.
func TestHostsFlag(t *testing.T) {
	var h HostsFlag
	if err := h.Set("releases.example.test=127.0.0.1:8080, pypi.org=mirror:3141"); err != nil {
		t.Fatal(err)
	}
	if err := h.Set("files.example.test=[::1]:80"); err != nil {
		t.Fatal(err)
	}
	// Several ports of one host: NAME:PORT names one; NAME:80 is NAME.
	if err := h.Set("releases.example.test:443=127.0.0.1:8443,releases.example.test:2222=127.0.0.1:22,files.example.test:443=[::1]:443"); err != nil {
		t.Fatal(err)
	}
	if got := h.String(); got != "files.example.test:443=[::1]:443,files.example.test=[::1]:80,pypi.org=mirror:3141,releases.example.test:2222=127.0.0.1:22,releases.example.test:443=127.0.0.1:8443,releases.example.test=127.0.0.1:8080" {
		t.Errorf("String() = %q", got)
	}
	if a, ok := sandbox.HostMap(h).HostUpstream("releases.example.test", 443); !ok || a != "127.0.0.1:8443" {
		t.Errorf("port 443 maps to %q, %v", a, ok)
	}
	var again HostsFlag
	if err := again.Set(h.String()); err != nil || again.String() != h.String() {
		t.Errorf("String() does not round-trip: %q, %v", again.String(), err)
	}
	for _, bad := range []string{"PyPI.org=a:1", "pypi.org=mirror", "pypi.org", "10.0.0.1=a:1", "pypi.org=a:1", "x.org=:80",
		"pypi.org:80=a:1", "releases.example.test:443=a:2", "x.org:0=a:1", "x.org:65536=a:1", "x.org:08=a:1", "x.org:=a:1", "x.org:https=a:1", "x.org:443=a:99999"} {
		if err := h.Set(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("Set(%q) = %v, want an error naming it", bad, err)
		}
	}
}

// TestHostsFlagTCP: NAME:PORT/tcp=HOST:PORT declares a port relayed as plain TCP; such a
// port names no host, so it is one host's alone (no other host maps it, as TLS or TCP),
// never 80 or 443, and a host's port is mapped once, TLS or TCP.
func TestHostsFlagTCP(t *testing.T) {
	var h HostsFlag
	if err := h.Set("db.example.test:5432/tcp=127.0.0.1:5432,db.example.test:443=127.0.0.1:8443,cache.example.test:6379/tcp=127.0.0.1:6379,db.example.test:8443=127.0.0.1:1,web.example.test:8443=127.0.0.1:2"); err != nil {
		t.Fatal(err)
	}
	m := sandbox.HostMap(h)
	if got := m.HostTCPPorts("db.example.test"); len(got) != 1 || got[0] != 5432 {
		t.Errorf("HostTCPPorts(db) = %v, want [5432]", got)
	}
	if got := m.HostPorts("db.example.test"); len(got) != 2 || got[0] != 443 || got[1] != 8443 {
		t.Errorf("HostPorts(db) = %v, want the TLS ports alone", got)
	}
	var again HostsFlag
	if err := again.Set(h.String()); err != nil || again.String() != h.String() {
		t.Errorf("String() does not round-trip: %q, %v", again.String(), err)
	}
	for bad, why := range map[string]string{
		"db.example.test:5432=a:1":        "mapped twice",
		"db.example.test:5432/tcp=a:1":    "mapped twice",
		"db.example.test:443/tcp=a:1":     "HTTP or HTTPS",
		"db.example.test:80/tcp=a:1":      "HTTP or HTTPS",
		"db.example.test/tcp=a:1":         "is not NAME",
		"other.example.test:5432/tcp=a:1": "mapped for host db.example.test too",
		"other.example.test:5432=a:1":     "mapped for host db.example.test too",
		"other.example.test:8443/tcp=a:1": "is mapped for host",
		"db.example.test:22/udp=a:1":      "is not NAME",
	} {
		if err := h.Set(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), why) {
			t.Errorf("Set(%q) = %v, want an error naming it: %s", bad, err, why)
		}
	}
}
