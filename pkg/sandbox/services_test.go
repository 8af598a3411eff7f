package sandbox

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestServicesValidate(t *testing.T) {
	ok := Spec{Services: []Service{{Name: "api", Port: 8080, Upstream: "127.0.0.1:9000"}, {Name: "db-1", Port: 5432, Upstream: "localhost:5432", Protocol: ProtocolTCP}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid services refused: %v", err)
	}
	bad := Spec{Services: []Service{
		{Name: "Api", Port: 80, Upstream: "127.0.0.1:1"},
		{Name: "db", Port: 0, Upstream: "127.0.0.1"},
		{Name: "db", Port: 81, Upstream: "127.0.0.1:99999", Protocol: "udp"},
		{Name: "sandbox", Port: 81, Upstream: ":80"},
	}}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("want ErrInvalid, got %v", err)
	}
	for _, want := range []string{
		"services[0].name", "services[1].port", "services[1].upstream", `services[2].name: "db" appears twice`,
		"services[2].upstream", "services[2].protocol", `services[3].name: "sandbox" is reserved`, "services[3].port: 81 is used", "services[3].upstream",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	env := strings.Join(ServiceEnv(ok.Services), " ")
	if env != "API_ADDR=api:8080 API_URL=http://api:8080 DB_1_ADDR=db-1:5432" {
		t.Errorf("env: %s", env)
	}
}

// TestEgressValidate: an egress service names lower-case hosts, once each, and nothing
// else a service has; one per sandbox; it is announced by no variable.
func TestEgressValidate(t *testing.T) {
	ok := Spec{Services: []Service{{Name: "egress", Port: 80, Protocol: ProtocolEgress, Hosts: []string{"pypi.org", "releases.example.test"}, TLSPorts: []int{443, 8443}}, {Name: "api", Port: 8080, Upstream: "127.0.0.1:9000"}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid egress refused: %v", err)
	}
	if env := strings.Join(ServiceEnv(ok.Services), " "); env != "API_ADDR=api:8080 API_URL=http://api:8080" {
		t.Errorf("env: %s", env)
	}
	bad := Spec{Services: []Service{
		{Name: "egress", Port: 80, Protocol: ProtocolEgress, Upstream: "127.0.0.1:1", Hosts: []string{"PyPI.org", "10.0.0.1", "a.org", "a.org", "api", "localhost", "x_y.org"}},
		{Name: "api", Port: 81, Upstream: "127.0.0.1:2", Hosts: []string{"a.org"}, TLSPorts: []int{443}},
		{Name: "second", Port: 82, Protocol: ProtocolEgress, TLSPorts: []int{443, 0, 81, 443}},
	}}
	err := bad.Validate()
	for _, want := range []string{
		"services[0].upstream", `services[0].hosts[0]: "PyPI.org" is not`, `services[0].hosts[1]: "10.0.0.1" is not`, `services[0].hosts[3]: "a.org" appears twice`,
		`services[0].hosts[4]: "api" is reserved or a service's name`, `services[0].hosts[5]: "localhost" is reserved`, `services[0].hosts[6]`,
		"services[1].hosts: only an egress service has hosts", "services[2].protocol: a second egress service",
		"services[1].tls_ports: only an egress service has TLS ports", "services[2].tls_ports[1]: 0 must be 1-65535",
		"services[2].tls_ports[2]: 81 is used by another service", "services[2].tls_ports[3]: 443 is used by another service or appears twice",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	if s, ok := ServiceByPort(ok.Services, 8443); !ok || s.Name != "egress" {
		t.Errorf("ServiceByPort(8443) = %v, %v: want the egress service, whose TLS port it is", s, ok)
	}
	for name, valid := range map[string]bool{"a": true, "a-b.c1": true, "x.123": false, "-a.b": false, "a-.b": false, "a..b": false, "": false, strings.Repeat("a", 64) + ".b": false} {
		if ValidHostName(name) != valid {
			t.Errorf("ValidHostName(%q) = %v", name, !valid)
		}
	}
}

// TestHostMap: a key without a port maps a host's port 80, NAME:PORT another port; a
// host's ports are listed once each, ascending.
func TestHostMap(t *testing.T) {
	m := HostMap{"a.test": "127.0.0.1:1", "a.test:443": "127.0.0.1:2", "a.test:8443": "127.0.0.1:3", "b.test:443": "127.0.0.1:4"}
	for _, c := range []struct {
		name string
		port int
		want string
	}{{"a.test", 80, "127.0.0.1:1"}, {"a.test", 443, "127.0.0.1:2"}, {"a.test", 8443, "127.0.0.1:3"}, {"b.test", 443, "127.0.0.1:4"}, {"b.test", 80, ""}, {"a.test", 22, ""}} {
		if got, ok := m.HostUpstream(c.name, c.port); got != c.want || ok != (c.want != "") {
			t.Errorf("HostUpstream(%s, %d) = %q, %v, want %q", c.name, c.port, got, ok, c.want)
		}
	}
	if got := m.HostPorts("a.test"); !slices.Equal(got, []int{80, 443, 8443}) {
		t.Errorf("HostPorts(a.test) = %v", got)
	}
	for _, k := range []string{"A.test", "a.test:0", "a.test:080", "a.test:65536", "a.test:", "a.test:x", "10.0.0.1:443"} {
		if _, _, ok := SplitHostKey(k); ok {
			t.Errorf("SplitHostKey(%q) accepted", k)
		}
	}
}

// TestEgressTCPPorts: an egress service's plain TCP ports are each one of its hosts'
// and no other port of the sandbox; ServiceByPort finds them; a HostMap's NAME:PORT/tcp
// keys map them, apart from its HTTP and TLS ports.
func TestEgressTCPPorts(t *testing.T) {
	ok := Spec{Services: []Service{{Name: "egress", Port: 80, Protocol: ProtocolEgress, Hosts: []string{"db.example.test", "pypi.org"}, TLSPorts: []int{443}, TCPPorts: []HostPort{{"db.example.test", 5432}}}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid egress refused: %v", err)
	}
	if s, found := ServiceByPort(ok.Services, 5432); !found || s.Name != "egress" {
		t.Errorf("ServiceByPort(5432) = %v, %v: want the egress service, whose TCP port it is", s, found)
	}
	bad := Spec{Services: []Service{
		{Name: "egress", Port: 80, Protocol: ProtocolEgress, Hosts: []string{"db.example.test"}, TLSPorts: []int{443},
			TCPPorts: []HostPort{{"db.example.test", 5432}, {"other.example.test", 5433}, {"db.example.test", 443}, {"db.example.test", 5432}, {"db.example.test", 0}, {"db.example.test", 8080}}},
		{Name: "api", Port: 8080, Upstream: "127.0.0.1:2", TCPPorts: []HostPort{{"a.org", 1}}},
	}}
	err := bad.Validate()
	for _, want := range []string{
		`services[0].tcp_ports[1]: host "other.example.test" is not one of the service's hosts`,
		"services[0].tcp_ports[2]: 443 is used by another service or port",
		"services[0].tcp_ports[3]: 5432 is used by another service or port, or appears twice",
		"services[0].tcp_ports[4]: 0 must be 1-65535",
		"services[1].port: 8080 is used by another service",
		"services[1].tcp_ports: only an egress service has plain TCP ports",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	m := HostMap{"db.test": "127.0.0.1:1", "db.test:443": "127.0.0.1:2", "db.test:5432/tcp": "127.0.0.1:3", "db.test:6379/tcp": "127.0.0.1:4"}
	if got := m.HostPorts("db.test"); !slices.Equal(got, []int{80, 443}) {
		t.Errorf("HostPorts = %v, want the HTTP and TLS ports", got)
	}
	if got := m.HostTCPPorts("db.test"); !slices.Equal(got, []int{5432, 6379}) {
		t.Errorf("HostTCPPorts = %v, want the plain TCP ports", got)
	}
	if a, found := m.HostUpstream("db.test", 5432); !found || a != "127.0.0.1:3" {
		t.Errorf("HostUpstream(db.test, 5432) = %q, %v", a, found)
	}
}
