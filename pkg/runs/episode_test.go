package runs_test

import (
	"math"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Episodes derive from (run, index) as documented: the id is the run id and the index,
// the seed is rng.DeriveN(run seed, "episode", index), distinct for every episode of a
// run, and the policy is drawn by weight. The literal seeds pin the derivation: changing
// it changes every recorded run's trajectories, which replay would then call divergent.
func TestEpisodesDeriveFromRunAndIndex(t *testing.T) {
	r := &gauntletv1.RunRequested{RunId: "r-seeds", Env: "shop", Seed: 42, Episodes: 100_000,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 3}, {Name: "random", Weight: 1}}}
	seeds := make(map[uint64]uint64, r.Episodes)
	picked := map[string]int{}
	for i := range r.Episodes {
		ep := runs.Episode(r, i)
		if want := runs.EpisodeID(r.RunId, i); ep.EpisodeId != want || ep.Index != i || ep.RunId != r.RunId {
			t.Fatalf("episode %d: id %q index %d run %q, want %q %d %q", i, ep.EpisodeId, ep.Index, ep.RunId, want, i, r.RunId)
		}
		if want := rng.DeriveN(r.Seed, "episode", i); ep.Seed != want {
			t.Fatalf("episode %d has seed %d, want DeriveN(run seed, \"episode\", %d) = %d", i, ep.Seed, i, want)
		}
		if j, dup := seeds[ep.Seed]; dup {
			t.Fatalf("episodes %d and %d of one run share seed %d", j, i, ep.Seed)
		}
		seeds[ep.Seed] = i
		picked[ep.Policy]++
	}
	// Fixed values of the derivation, for the run seed 42.
	for i, want := range []uint64{2815942419114670294, 9805215582857441472, 2079642860458836818} {
		if got := runs.Episode(r, uint64(i)).Seed; got != want {
			t.Errorf("episode %d of a run with seed 42 has seed %d, want %d: the derivation changed", i, got, want)
		}
	}
	if share := float64(picked["oracle"]) / float64(r.Episodes); math.Abs(share-0.75) > 0.01 || picked["oracle"]+picked["random"] != int(r.Episodes) {
		t.Errorf("policies picked %v; want about 3 oracle to 1 random and nothing else", picked)
	}
	// Another run's seed gives other episodes.
	other := runs.Episode(&gauntletv1.RunRequested{RunId: "r-seeds", Seed: 43, Policies: r.Policies}, 0)
	if other.Seed == runs.Episode(r, 0).Seed {
		t.Errorf("run seeds 42 and 43 give episode 0 the same seed %d", other.Seed)
	}
}
