package runs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A user-defined profile of storage faults is refused at submission for an env without a
// sandbox, naming the profile and the fault, and accepted for a sandboxed env.
func TestStorageProfileNeedsASandboxedEnv(t *testing.T) {
	const spec = "name: bad-disk\nfaults:\n  - {id: full, kind: disk_full, probability: 0.1}\n"
	req := func(envName string) *gauntletv1.RunRequested {
		return &gauntletv1.RunRequested{RunId: "r1", Env: envName, Episodes: 1, MaxInFlight: 1,
			Policies:       []*gauntletv1.Share{{Name: "oracle", Weight: 1}},
			Profiles:       []*gauntletv1.Share{{Name: "bad-disk", Weight: 1}},
			CustomProfiles: []*gauntletv1.CustomProfile{{Name: "bad-disk", SpecYaml: spec}}}
	}
	err := runs.Validate(req("shop"))
	if err == nil || !strings.Contains(err.Error(), `custom_profiles (bad-disk): plan: profile bad-disk: fault full: disk_full applies only in envs whose agents act in a real sandbox`) {
		t.Fatalf("shop with a storage profile: %v", err)
	}
	if err := runs.Validate(req("codefix")); err != nil {
		t.Fatalf("codefix with a storage profile: %v", err)
	}
}

// A learned profile shop cannot run is refused at submission with every reason at once,
// not one pass of reasons per submission.
func TestUnfitProfileRefusedAllAtOnce(t *testing.T) {
	spec, err := os.ReadFile(filepath.Join("..", "faults", "plans", "testdata", "profiles", "learned-shop.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	err = runs.Validate(&gauntletv1.RunRequested{RunId: "r1", Env: "shop", Episodes: 1, MaxInFlight: 1,
		Policies:       []*gauntletv1.Share{{Name: "oracle", Weight: 1}},
		Profiles:       []*gauntletv1.Share{{Name: "learned-shop", Weight: 1}},
		CustomProfiles: []*gauntletv1.CustomProfile{{Name: "learned-shop", SpecYaml: string(spec)}}})
	for _, want := range []string{
		"faults[0].kind: timeout cannot apply in a sim env",
		"faults[1].kind: reset cannot apply in a sim env",
		"fault disk-full: disk_full applies only in envs whose agents act in a real sandbox",
		`fault http-429: unknown service "psp"`,
		"faults[4].match: a sim env's calls have no host, path, method or op",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run of learned-shop on shop: want %q in\n%v", want, err)
		}
	}
}
