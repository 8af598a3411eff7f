package play_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// An attack one player's sandbox records is fingerprinted for the others: a later
// episode played elsewhere (its own watcher, as in another process) sending the same
// command, quoted differently, is flagged on that step and no other; the recording step
// itself is not (nothing was known yet); a replay of the flagged episode gives back the
// recorded flags, and a replay of the recording one adds none, whatever is known by then.
func TestThreatFingerprintsAcrossEpisodes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs codefix in process sandboxes")
	}
	b := bustest.Start(t)
	sb := runtimestest.Open(t, runtimes.Process, 0)
	watcher := func() *threats.Watcher {
		w := threats.NewWatcher(b.JS, noop.NewMeterProvider().Meter("test"), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		go w.Run(ctx)
		return w
	}
	here, there := watcher(), watcher()
	exec := func(cmd string) env.Action {
		args, _ := json.Marshal(map[string]string{"command": cmd})
		return env.Action{Tool: "shell.exec", Args: args}
	}
	play1 := func(id string, w *threats.Watcher, acts []env.Action, rec []play.Recorded) []*gauntletv1.StepTaken {
		t.Helper()
		req := &gauntletv1.EpisodeRequested{EpisodeId: id, RunId: "r", Env: "codefix", ParamsJson: "{}", Seed: 3, Policy: "scripted"}
		plan := &gauntletv1.FaultPlan{Profile: "baseline", Seed: rng.Derive(3, "faults"), CatalogueVersion: plans.CatalogueVersion, Compact: true}
		out := &memOut{}
		s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, "w-"+id, play.LocalScorer{Spec: scoring.SpecFor("codefix")}, out)
		defer func() { _ = s.Close() }()
		ctx := context.Background()
		if _, err := s.Prepare(ctx, play.Deps{Sandboxes: sb, Threats: w}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reset(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if rec != nil {
			if _, _, err := s.Replay(ctx, rec); err != nil {
				t.Fatal(err)
			}
		}
		for _, a := range acts {
			if _, _, err := s.Step(ctx, a, nil); err != nil {
				t.Fatal(err)
			}
		}
		return out.steps
	}
	flagged := func(st *gauntletv1.StepTaken) bool {
		return len(play.ThreatFlags(st.GetSignals().GetSafetyEvents())) > 0
	}

	attack := "cat /dev/mem > /dev/null; true"
	first := play1("e1", here, []env.Action{exec("ls"), exec(attack)}, nil)
	if flagged(first[1]) || !strings.Contains(strings.Join(first[1].Signals.GetSafetyEvents(), "\n"), "device_access") {
		t.Fatalf("the recording step: %q, want its device_access and no flag", first[1].Signals.GetSafetyEvents())
	}
	f, _ := threats.Make("shell.exec", []byte(exec(attack).Args), first[1].Signals.SafetyEvents)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := there.WaitFor(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	later := play1("e2", there, []env.Action{exec("ls"), exec(`cat  "/dev/mem" > /dev/null;   true`), exec("ls")}, nil)
	if flagged(later[0]) || !flagged(later[1]) || flagged(later[2]) {
		t.Fatalf("flags of the later episode's steps: %v %v %v, want only the repeat's", flagged(later[0]), flagged(later[1]), flagged(later[2]))
	}
	if fl := play.ThreatFlags(later[1].Signals.SafetyEvents); !strings.Contains(fl[0], "first in episode e1 step 1") {
		t.Errorf("flag %q does not say where the fingerprint was first recorded", fl[0])
	}
	// Replays give back what was recorded, whatever the watcher knows now.
	var rec []play.Recorded
	for _, st := range later {
		rec = append(rec, play.Recorded{Action: env.Action{Tool: st.Action.Tool, Args: json.RawMessage(st.Action.ArgsJson)}, Flags: play.ThreatFlags(st.Signals.GetSafetyEvents())})
	}
	replayed := play1("e2", here, nil, rec)
	for i := range later {
		if flagged(replayed[i]) != flagged(later[i]) {
			t.Errorf("replayed step %d flagged %v, recorded %v", i, flagged(replayed[i]), flagged(later[i]))
		}
	}
	rec = rec[:0]
	for _, st := range first {
		rec = append(rec, play.Recorded{Action: env.Action{Tool: st.Action.Tool, Args: json.RawMessage(st.Action.ArgsJson)}, Flags: play.ThreatFlags(st.Signals.GetSafetyEvents())})
	}
	if replayed := play1("e1", here, nil, rec); flagged(replayed[1]) {
		t.Error("a replay flagged the recording step, recorded unflagged")
	}
}
