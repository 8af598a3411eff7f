package codefix_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// TestBuiltinStressPlanReachesTheTools: a built-in stress plan whose boundary family is
// failing storage makes some of the agent's writes fail with ENOSPC, EMFILE or a
// short write, each recorded on its step; the same plan replays the same faults.
func TestBuiltinStressPlanReachesTheTools(t *testing.T) {
	var spec string
	var seed uint64
	for ; seed < 200; seed++ {
		p, err := plans.Derive(seed, plans.ProfileStress, codefix.New().Spec().Services)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(p.BoundarySpec, "kind: disk_full") {
			spec = p.BoundarySpec
			break
		}
	}
	if spec == "" {
		t.Fatal("no stress plan of seeds 0-199 amplifies failing storage")
	}
	sb := testSandboxes(t)
	trace := func() string {
		p, _ := plans.Derive(seed, plans.ProfileStress, codefix.New().Spec().Services)
		in, err := inject.NewInjector(p)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := codefix.New().NewEpisode(env.Config{Seed: 3, Sandboxes: sb, Faults: in})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close(ep)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i := range 18 { // the episode allows 20 steps
			res := step(t, ep, tools.FSWrite, map[string]string{"path": fmt.Sprintf("notes/%d.txt", i), "content": "note\n"})
			var kinds []string
			for _, f := range res.Faults {
				if k, _ := catalogue.LookupKind(f.Kind); k.Layer == catalogue.LayerStorage && strings.HasPrefix(f.Target, codefix.Service+"/") {
					kinds = append(kinds, f.Kind)
				}
			}
			obs := string(res.Observation)
			met := ""
			switch {
			case strings.Contains(obs, "no space left on device"):
				met = "ENOSPC"
			case strings.Contains(obs, "too many open files"):
				met = "EMFILE"
			case strings.Contains(obs, "short write"):
				met = "short"
			}
			fmt.Fprintf(&b, "%d met=%s recorded=%s\n", i, met, strings.Join(kinds, ","))
		}
		return b.String()
	}
	first := trace()
	t.Logf("seed %d, boundary spec:\n%s\n%s", seed, spec, first)
	errs := 0
	for _, line := range strings.Split(strings.TrimSpace(first), "\n") {
		f := strings.Fields(line)
		met, recorded := strings.TrimPrefix(f[1], "met="), strings.TrimPrefix(f[2], "recorded=")
		want := map[string]string{"ENOSPC": "disk_full", "EMFILE": "too_many_open_files", "short": "short_write"}[met]
		aborts := strings.Contains(recorded, "disk_full") || strings.Contains(recorded, "too_many_open_files") || strings.Contains(recorded, "short_write")
		if (want == "") == aborts || (want != "" && !strings.Contains(recorded, want)) {
			t.Errorf("what the agent met and what was recorded differ: %s", line)
		}
		if want != "" {
			errs++
		}
	}
	if errs == 0 {
		t.Errorf("18 writes under failing storage met no error:\n%s", first)
	}
	if again := trace(); again != first {
		t.Errorf("same plan, other faults:\n%s\nvs\n%s", first, again)
	}
}
