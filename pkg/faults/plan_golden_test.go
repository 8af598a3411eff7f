package faults_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"google.golang.org/protobuf/proto"
)

// planDigest hashes the deterministic encoding of the plans of seeds 0..499 of every
// built-in profile for services; with rulesOnly, of their rules alone (boundary_spec
// left out).
func planDigest(t *testing.T, services []string, rulesOnly bool) string {
	t.Helper()
	h := sha256.New()
	for _, profile := range faults.Profiles() {
		for seed := uint64(0); seed < 500; seed++ {
			p := mustPlan(t, seed, profile, services)
			if rulesOnly {
				p.BoundarySpec = ""
			}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestBuiltinPlansGolden pins the built-in plans (B3, B4): a shop env's plans are
// byte-identical to those before sandboxed envs got boundary faults, and a sandboxed
// env's (codefix: docs, sandbox) rules too, only its boundary_spec being new. A change
// here changes every recorded episode's replay: update the digests only on purpose.
// (The encoding is protobuf-go's deterministic one, stable within its pinned version.)
func TestBuiltinPlansGolden(t *testing.T) {
	for _, tc := range []struct {
		services  []string
		rulesOnly bool
		want      string
	}{
		{shopServices, false, "3eb537ec023d84b2288a000508f8597d6e926f2cdab5c4f5512946e7ee1f13d4"},
		{[]string{"docs", "sandbox"}, true, "7227297a016b215f77ba02e86d5c6732608136922448b3fc3241be272fe015a9"},
	} {
		if got := planDigest(t, tc.services, tc.rulesOnly); got != tc.want {
			t.Errorf("plans of %v changed: digest %s, want %s", tc.services, got, tc.want)
		}
	}
}
