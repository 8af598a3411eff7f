package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/golden-episodes.txt")

// goldenEpisodes is what TestEpisodesAreGolden plays: seeded shop episodes of both
// built-in policies under the stress and edge fault profiles, and one codefix episode in a
// process sandbox.
var goldenEpisodes = []struct {
	env, policy, profile string
	seed                 uint64
}{
	{"shop", "oracle", "stress", 1}, {"shop", "oracle", "stress", 2}, {"shop", "oracle", "edge", 3},
	{"shop", "oracle", "edge", 4}, {"shop", "random", "stress", 5}, {"shop", "random", "stress", 6},
	{"shop", "random", "edge", 7}, {"shop", "random", "edge", 8}, {"shop", "oracle", "baseline", 9},
	{"codefix", "oracle", "stress", 10},
}

// TestEpisodesAreGolden plays a fixed set of episodes through the worker (assignment in,
// events out, scored by the reward service) and compares a digest of every event it
// recorded, its wall-clock fields zeroed, with testdata/golden-episodes.txt: whatever is
// refactored in the path an episode takes, the same episode must record the same events.
// Run with -update to rewrite the file after an intended change.
func TestEpisodesAreGolden(t *testing.T) {
	b, _ := startWorkerWith(t, func(c *Config) {
		c.ID = "w-golden"
		c.SegmentSteps = 4 // several segments per episode
		sb := runtimestest.Open(t, runtimes.Process, 0)
		c.Sandboxes = func() env.Sandboxes { return sb }
	})
	ctx := context.Background()
	runID := "rgolden"
	a := &gauntletv1.Assignment{}
	for i, g := range goldenEpisodes {
		r := &gauntletv1.RunRequested{RunId: runID, Env: g.env, ParamsJson: "{}", Seed: g.seed,
			Policies: []*gauntletv1.Share{{Name: g.policy, Weight: 1}}, RequestedAtUnixNano: 1_700_000_000_000_000_000}
		ep := runs.Episode(r, uint64(i))
		// As the faults service hands plans out: compact, by reference to the profile.
		plan := &gauntletv1.FaultPlan{Profile: g.profile, Seed: rng.Derive(ep.Seed, "faults"),
			CatalogueVersion: plans.CatalogueVersion, Compact: true}
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: ep, Plan: plan})
	}
	if err := b.PublishCommand(ctx, bus.SubjectEpisode(runID), runID+"/assigned", a); err != nil {
		t.Fatal(err)
	}
	endedMessages(t, b, runID) // waits until the assignment is settled

	var lines []string
	for _, ev := range runEvents(t, b, runID) {
		for _, ev := range ev.Events() {
			lines = append(lines, goldenLines(t, ev)...)
		}
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"
	ended := strings.Count(got, " ended ")
	if ended != len(goldenEpisodes) {
		t.Fatalf("%d episodes ended, want %d:\n%s", ended, len(goldenEpisodes), got)
	}
	if strings.Contains(got, "infra_error") {
		t.Fatalf("an episode ended in an infra error:\n%s", got)
	}
	path := filepath.Join("testdata", "golden-episodes.txt")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to record it)", err)
	}
	if got != string(want) {
		t.Errorf("the episodes recorded other events than %s (run with -update after an intended change); got:\n%s", path, got)
	}
}

// goldenLines returns one line per started, step and ended record of ev: its episode, what
// it is, and the digest of the record with its wall-clock fields zeroed.
func goldenLines(t *testing.T, ev *gauntletv1.Event) []string {
	t.Helper()
	var out []string
	add := func(id, what string, m proto.Message) {
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		out = append(out, fmt.Sprintf("%s %s %s", id, what, hex.EncodeToString(sum[:12])))
	}
	started := func(s *gauntletv1.EpisodeStarted) {
		s = proto.Clone(s).(*gauntletv1.EpisodeStarted)
		s.StartedAtUnixNano = 0
		add(s.GetEpisode().GetEpisodeId(), "started", s)
	}
	ended := func(e *gauntletv1.EpisodeEnded) {
		e = proto.Clone(e).(*gauntletv1.EpisodeEnded)
		e.StartedAtUnixNano, e.EndedAtUnixNano = 0, 0
		what := "ended"
		if e.InfraError {
			what = "ended infra_error " + e.Error
		}
		add(e.GetEpisode().GetEpisodeId(), what, e)
	}
	switch {
	case ev.GetSteps() != nil:
		seg := ev.GetSteps()
		if seg.Started != nil {
			started(seg.Started)
		}
		for _, st := range seg.Steps {
			st = proto.Clone(st).(*gauntletv1.StepTaken)
			if m := st.Metering; m != nil {
				// Host times (the env's, the policy's, the scoring's), and what the sandbox
				// measured of the process's run.
				m.WallNs, m.CpuNs, m.PeakMemoryBytes, m.ReadBytes, m.WrittenBytes = 0, 0, 0, 0, 0
				m.PolicyNs, m.RewardNs = 0, 0
			}
			add(st.EpisodeId, fmt.Sprintf("step %03d", st.Step), st)
		}
		if seg.Ended != nil {
			ended(seg.Ended)
		}
	case ev.GetStarted() != nil:
		started(ev.GetStarted())
	case ev.GetEnded() != nil:
		ended(ev.GetEnded())
	default:
		t.Fatalf("unexpected event %v", ev)
	}
	return out
}

// runEvents returns every event of the run in GAUNTLET_EVENTS.
func runEvents(t *testing.T, b *bus.Bus, runID string) []*gauntletv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := b.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*gauntletv1.Event
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
		if errors.Is(err, nats.ErrTimeout) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev gauntletv1.Event
		if err := gauntletv1.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(m.Subject(), runID) {
			out = append(out, &ev)
		}
	}
}
