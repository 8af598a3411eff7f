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
