package sandbox

import (
	"errors"
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
	ok := Spec{Services: []Service{{Name: "egress", Port: 80, Protocol: ProtocolEgress, Hosts: []string{"pypi.org", "releases.example.test"}}, {Name: "api", Port: 8080, Upstream: "127.0.0.1:9000"}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid egress refused: %v", err)
	}
	if env := strings.Join(ServiceEnv(ok.Services), " "); env != "API_ADDR=api:8080 API_URL=http://api:8080" {
		t.Errorf("env: %s", env)
	}
	bad := Spec{Services: []Service{
		{Name: "egress", Port: 80, Protocol: ProtocolEgress, Upstream: "127.0.0.1:1", Hosts: []string{"PyPI.org", "10.0.0.1", "a.org", "a.org", "api", "localhost", "x_y.org"}},
		{Name: "api", Port: 81, Upstream: "127.0.0.1:2", Hosts: []string{"a.org"}},
		{Name: "second", Port: 82, Protocol: ProtocolEgress},
	}}
	err := bad.Validate()
	for _, want := range []string{
		"services[0].upstream", `services[0].hosts[0]: "PyPI.org" is not`, `services[0].hosts[1]: "10.0.0.1" is not`, `services[0].hosts[3]: "a.org" appears twice`,
		`services[0].hosts[4]: "api" is reserved or a service's name`, `services[0].hosts[5]: "localhost" is reserved`, `services[0].hosts[6]`,
		"services[1].hosts: only an egress service has hosts", "services[2].protocol: a second egress service",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	for name, valid := range map[string]bool{"a": true, "a-b.c1": true, "x.123": false, "-a.b": false, "a-.b": false, "a..b": false, "": false, strings.Repeat("a", 64) + ".b": false} {
		if ValidHostName(name) != valid {
			t.Errorf("ValidHostName(%q) = %v", name, !valid)
		}
	}
}
