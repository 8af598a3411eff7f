package store

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestRunsAndStagesAreProjected puts run states and a closed stage in their KV buckets,
// one before the store starts and the rest while it runs, as the scheduler and a
// curriculum do, and reads them back from the runs and curriculum_stages tables: the
// origin, the counts, and a run's final state replacing its running one.
func TestRunsAndStagesAreProjected(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := chtest.Start(t)
	b := bustest.Start(t)
	runsKV, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	stagesKV, err := b.JS.KeyValue(ctx, bus.BucketCurricula)
	if err != nil {
		t.Fatal(err)
	}
	submitted := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixNano()
	spec := &gauntletv1.RunRequested{
		RunId: "cabc-s1-b2", Env: "shop", ParamsJson: "{}", Episodes: 10, Seed: 42, Label: "curriculum t stage 1 (b)",
		Policies:            []*gauntletv1.Share{{Name: "random", Weight: 1}, {Name: "oracle", Weight: 3}},
		PolicyEndpoint:      &gauntletv1.PolicyEndpoint{Url: "http://10.0.0.7:8000/v1", Model: "qwen3-8b", Credential: "lab-vllm", Logprobs: gauntletv1.Logprobs_LOGPROBS_OFF},
		Profiles:            []*gauntletv1.Share{{Name: "baseline", Weight: 1}, {Name: "mine", Weight: 1}},
		CustomProfiles:      []*gauntletv1.CustomProfile{{Name: "mine", SpecYaml: "name: mine\n"}},
		Drift:               []*gauntletv1.Drift{{Selector: "*.latency.mean_ms"}},
		RequestedAtUnixNano: submitted,
		Origin: &gauntletv1.RunOrigin{
			SubmittedBy: "ana@lab", GauntletVersion: "v1.2.3", ProfileFiles: []string{"mine.yaml"},
			DriftText: "*.latency.mean_ms=linear(0:20,9:500)", RewardSpec: "default/1",
			CurriculumId: "curriculum-t-1", CurriculumName: "t", CurriculumPrefix: "cabc", Stage: 1, StageName: "b", Batch: 2,
		},
	}
	put := func(s *gauntletv1.RunState) {
		t.Helper()
		data, err := gauntletv1.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := runsKV.Put(ctx, s.GetSpec().GetRunId(), data); err != nil {
			t.Fatal(err)
		}
	}
	started := submitted + int64(time.Second)
	put(&gauntletv1.RunState{Spec: spec, Assigned: 10, EndedLow: 4, Succeeded: 3, Steps: 40,
		StartedAtUnixNano: started, UpdatedAtUnixNano: started + int64(time.Second)})
	refused := &gauntletv1.RunRequested{RunId: "r2", Env: "nope", Episodes: 5, RequestedAtUnixNano: submitted}
	put(&gauntletv1.RunState{Spec: refused, Error: "env: unknown env nope", StartedAtUnixNano: started, UpdatedAtUnixNano: started})
	// A run over tasks records the tasks its params pin (as `gauntlet run --tasks` makes them).
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	overTasks := &gauntletv1.RunRequested{RunId: "r3", Env: "tasks", Episodes: 4, RequestedAtUnixNano: submitted,
		ParamsJson: `{"dataset":"gauntlet","tags":["python"],"tasks":[{"id":"python/a","digest":"` + d1 + `"},{"id":"python/b","digest":"` + d2 + `"}]}`}
	put(&gauntletv1.RunState{Spec: overTasks, Assigned: 4, EndedLow: 4, StartedAtUnixNano: started, UpdatedAtUnixNano: started})

	s := New(Config{Addr: ch.Addr, Database: "meta", BatchRows: 10, FlushEvery: time.Second, IdleFlush: 50 * time.Millisecond, AckWait: 30 * time.Second},
		func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stopping(context.Background()) }()
	done := make(chan error, 1)
	go func() { done <- s.Running(ctx) }()

	// The run ends while the store runs; its stage then closes.
	finished := started + int64(5*time.Second)
	put(&gauntletv1.RunState{Spec: spec, Assigned: 10, EndedLow: 10, Succeeded: 8, Steps: 90, FaultsFired: 7, InfraErrors: 1,
		RewardSum: 6.5, StartedAtUnixNano: started, UpdatedAtUnixNano: finished})
	closed := finished + int64(time.Second)
	tr := &gauntletv1.StageTransition{CurriculumId: "curriculum-t-1", CurriculumName: "t", CurriculumPrefix: "cabc",
		Stage: 1, StageName: "b", Outcome: "promoted", Metric: "success_rate", Threshold: 0.8, Window: 10, WindowValue: 0.8,
		Episodes: 30, Succeeded: 22, RewardSum: 20, InfraErrors: 4, Batches: 3, NextStage: 2, ClosedAtUnixNano: closed,
		InfraKinds: []string{"model_endpoint", "sandbox"}, InfraCounts: []uint64{3, 1}}
	data, err := gauntletv1.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stagesKV.Put(ctx, "cabc.1", data); err != nil {
		t.Fatal(err)
	}

	var runs []trajectory.RunRow
	var stages []trajectory.StageRow
	deadline := time.Now().Add(time.Minute)
	for {
		runs, err = trajectory.Runs(ctx, s.conn, "meta")
		if err == nil {
			stages, err = trajectory.CurriculumStages(ctx, s.conn, "meta", "curriculum-t-1")
		}
		if err == nil && len(runs) == 3 && len(stages) == 1 && runs[0].State != trajectory.RunRunning && runs[1].State != trajectory.RunRunning && runs[2].State != trajectory.RunRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: runs %+v, stages %+v, err %v", runs, stages, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	byID := map[string]trajectory.RunRow{}
	for _, r := range runs {
		byID[r.RunID] = r
	}
	r := byID["cabc-s1-b2"]
	want := trajectory.RunRow{
		RunID: "cabc-s1-b2", Label: "curriculum t stage 1 (b)", Env: "shop", Params: "{}", TaskIDs: []string{}, TaskDigests: []string{},
		PolicyMix: "random=1,oracle=3", ProfileMix: "baseline=1,mine=1", ProfileFiles: []string{"mine.yaml"},
		CustomProfiles: []string{"mine"}, DriftText: "*.latency.mean_ms=linear(0:20,9:500)", DriftSelectors: []string{"*.latency.mean_ms"},
		Seed: 42, Episodes: 10, RewardSpec: "default/1",
		PolicyURL: "http://10.0.0.7:8000/v1", PolicyModel: "qwen3-8b", PolicyCredential: "lab-vllm", PolicyLogprobs: trajectory.LogprobsOff, CurriculumID: "curriculum-t-1", CurriculumName: "t", CurriculumPrefix: "cabc",
		Stage: 1, StageName: "b", Batch: 2, GauntletVersion: "v1.2.3", SubmittedBy: "ana@lab",
		SubmittedAt: time.Unix(0, submitted).UTC(), SubmittedAtNs: uint64(submitted),
		StartedAt: time.Unix(0, started).UTC().Truncate(time.Second), StartedAtNs: uint64(started),
		FinishedAt: time.Unix(0, finished).UTC().Truncate(time.Second), FinishedAtNs: uint64(finished),
		State: trajectory.RunDone, Assigned: 10, Ended: 10, Succeeded: 8, Steps: 90, FaultsFired: 7, InfraErrors: 1, RewardSum: 6.5,
		Version: uint64(finished),
	}
	if !equalRunRows(r, want) {
		t.Errorf("runs row\n got %+v\nwant %+v", r, want)
	}
	if ref := byID["r2"]; ref.State != trajectory.RunRefused || ref.Error != "env: unknown env nope" || ref.FinishedAtNs != uint64(started) {
		t.Errorf("refused run's row %+v", ref)
	}
	if tr := byID["r3"]; tr.TaskDataset != "gauntlet" || !slices.Equal(tr.TaskIDs, []string{"python/a", "python/b"}) || !slices.Equal(tr.TaskDigests, []string{d1, d2}) {
		t.Errorf("the run over tasks records %q %v %v", tr.TaskDataset, tr.TaskIDs, tr.TaskDigests)
	}
	if one, err := trajectory.Runs(ctx, s.conn, "meta", "cabc-s1-b2"); err != nil || len(one) != 1 || one[0].RunID != "cabc-s1-b2" {
		t.Errorf("runs by id: %+v, %v; want the one run", one, err)
	}
	if cur, err := trajectory.CurriculumRuns(ctx, s.conn, "meta", "cabc"); err != nil || len(cur) != 1 || cur[0].Batch != 2 {
		t.Errorf("runs of curriculum cabc: %+v, %v; want its one batch", cur, err)
	}
	st := stages[0]
	if st.Outcome != "promoted" || st.Stage != 1 || st.NextStage != 2 || st.WindowValue != 0.8 || st.Episodes != 30 || st.InfraErrors != 4 ||
		st.ClosedAtNs != uint64(closed) || st.CurriculumName != "t" || st.Metric != "success_rate" {
		t.Errorf("curriculum_stages row %+v", st)
	}
	if !slices.Equal(st.InfraKinds, []string{"model_endpoint", "sandbox"}) || !slices.Equal(st.InfraCounts, []uint64{3, 1}) {
		t.Errorf("curriculum_stages infra errors by kind %q %v; want model_endpoint 3, sandbox 1", st.InfraKinds, st.InfraCounts)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func equalRunRows(a, b trajectory.RunRow) bool {
	for _, r := range []*trajectory.RunRow{&a, &b} {
		r.SubmittedAt, r.StartedAt, r.FinishedAt = r.SubmittedAt.UTC(), r.StartedAt.UTC(), r.FinishedAt.UTC()
	}
	return reflect.DeepEqual(a, b)
}
