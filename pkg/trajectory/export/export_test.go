package export

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// sample is an episode with every kind of column value: times in a zone, empty and nil
// arrays, unicode, arguments that are not an object, floats that need every digit.
func sample() (trajectory.EpisodeRow, []trajectory.StepRow) {
	zone := time.FixedZone("X", 5*3600+1800)
	at := time.Date(2026, 11, 30, 10, 0, 0, 123456789, zone)
	ep := trajectory.EpisodeRow{
		RunID: "run-1", EpisodeID: "ep-1", Idx: 3, Env: "codefix", Params: `{"variant":2}`, Seed: 1<<63 + 5,
		Policy: "oracle", Profile: "stress", WorkerID: "w1", RequestedAt: at, StartedAt: at.Add(time.Second),
		EndedAt: at.Add(time.Minute), StartedAtNs: 1, EndedAtNs: 2, Steps: 2, Terminated: true, Reason: "success",
		Success: true, TotalReward: 0.1 + 0.2, FaultsFired: 1, VirtualTimeNs: 99, Version: 7,
		DriftSelectors: []string{"*.latency.mean_ms"}, DriftValues: []float64{2.5}, DriftSources: []string{"run"},
		PlanSeed: 11, CatalogueVersion: "c1", PlanDigest: "d",
	}
	steps := []trajectory.StepRow{
		{RunID: "run-1", EpisodeID: "ep-1", Step: 1, RequestedAt: at, Env: "codefix", Policy: "oracle", Tool: "shell.exec",
			Args: `{"cmd":"ls -la é"}`, Observation: `{"stdout":"a\nb","exit":0}`, StateDiff: `{}`,
			FaultIDs: []string{"f1"}, FaultKinds: []string{"latency"}, FaultTargets: []string{"sandbox"}, FaultDetails: []string{"+5ms"},
			ToolCalls: 1, VirtualNs: 5, WallNs: 6, Progress: 1.0 / 3, RewardNames: []string{"task", "cost"}, RewardValues: []float64{0, -0.01},
			Reward: -0.01, RTask: 0, RCost: -0.01, ViolationRules: []string{}, ViolationReasons: []string{}, SafetyEvents: nil,
			CPUNs: 10, PeakMemoryBytes: 1 << 40, Runtime: "process"},
		{RunID: "run-1", EpisodeID: "ep-1", Step: 2, RequestedAt: at.Add(time.Second), Env: "codefix", Policy: "oracle", Tool: "submit",
			Args: `[1,2]`, Observation: `{"pass":true}`, Success: true, Terminated: true, Reason: "success", Reward: 1, RTask: 1,
			InvalidAction: false, SafetyEvents: []string{"write_tests"}},
	}
	return ep, steps
}

// utc makes rows comparable after a round trip through JSON: the instants are kept,
// their zone is not.
func utc(ep trajectory.EpisodeRow, steps []trajectory.StepRow) (trajectory.EpisodeRow, []trajectory.StepRow) {
	ep.RequestedAt, ep.StartedAt, ep.EndedAt = ep.RequestedAt.UTC(), ep.StartedAt.UTC(), ep.EndedAt.UTC()
	out := make([]trajectory.StepRow, len(steps))
	for i, s := range steps {
		s.RequestedAt = s.RequestedAt.UTC()
		out[i] = s
	}
	return ep, out
}

func TestJSONLRoundTrip(t *testing.T) {
	ep, steps := sample()
	var buf bytes.Buffer
	if err := WriteJSONL(&buf, ep, steps); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "\n"); n != 3 {
		t.Fatalf("%d lines:\n%s", n, buf.String())
	}
	gotEp, gotSteps, err := ReadJSONL(&buf)
	if err != nil {
		t.Fatal(err)
	}
	wantEp, wantSteps := utc(ep, steps)
	gotEp, gotSteps = utc(gotEp, gotSteps)
	if !reflect.DeepEqual(gotEp, wantEp) {
		t.Errorf("episode\n got %+v\nwant %+v", gotEp, wantEp)
	}
	if !reflect.DeepEqual(gotSteps, wantSteps) {
		t.Errorf("steps\n got %+v\nwant %+v", gotSteps, wantSteps)
	}
}

func TestJSONLRefuses(t *testing.T) {
	ep, steps := sample()
	var buf bytes.Buffer
	if err := WriteJSONL(&buf, ep, steps); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(buf.String(), "\n")
	for name, text := range map[string]string{
		"empty":          "",
		"step first":     lines[1],
		"unknown column": strings.Replace(lines[0], `"run_id"`, `"run_id_x"`, 1) + lines[1],
		"other episode":  lines[0] + strings.Replace(lines[1], `"ep-1"`, `"ep-2"`, 1),
		"two keys":       lines[0] + `{"step":{},"episode":{}}` + "\n",
		"wrong type":     strings.Replace(lines[0], `"idx":3`, `"idx":"3"`, 1),
	} {
		if _, _, err := ReadJSONL(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestATIFRoundTrip(t *testing.T) {
	ep, steps := sample()
	tr, err := ToATIF(ep, steps, "v-test")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteATIF(&buf, tr); err != nil {
		t.Fatal(err)
	}
	// The document has ATIF's required fields where the format puts them.
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["schema_version"] != "ATIF-v1.4" || doc["session_id"] != "ep-1" {
		t.Errorf("root: %v %v", doc["schema_version"], doc["session_id"])
	}
	agent := doc["agent"].(map[string]any)
	if agent["name"] != "oracle" || agent["version"] != "v-test" {
		t.Errorf("agent %v", agent)
	}
	st := doc["steps"].([]any)[0].(map[string]any)
	call := st["tool_calls"].([]any)[0].(map[string]any)
	res := st["observation"].(map[string]any)["results"].([]any)[0].(map[string]any)
	if st["step_id"] != 1.0 || st["source"] != "agent" || call["function_name"] != "shell.exec" ||
		call["arguments"].(map[string]any)["cmd"] != "ls -la é" || res["source_call_id"] != call["tool_call_id"] ||
		res["content"] != steps[0].Observation {
		t.Errorf("step 1: %v", st)
	}
	if args := doc["steps"].([]any)[1].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)["arguments"]; !reflect.DeepEqual(args, map[string]any{"args": []any{1.0, 2.0}}) {
		t.Errorf("non-object arguments exported as %v", args)
	}

	back, err := ReadATIF(&buf)
	if err != nil {
		t.Fatal(err)
	}
	gotEp, gotSteps, err := FromATIF(back)
	if err != nil {
		t.Fatal(err)
	}
	wantEp, wantSteps := utc(ep, steps)
	gotEp, gotSteps = utc(gotEp, gotSteps)
	if !reflect.DeepEqual(gotEp, wantEp) || !reflect.DeepEqual(gotSteps, wantSteps) {
		t.Errorf("round trip differs:\n got %+v %+v\nwant %+v %+v", gotEp, gotSteps, wantEp, wantSteps)
	}
}

// TestATIFRefusesEdits: a trajectory whose standard fields were changed after export no
// longer reads as the recording.
func TestATIFRefusesEdits(t *testing.T) {
	ep, steps := sample()
	for name, edit := range map[string]func(*Trajectory){
		"observation":  func(tr *Trajectory) { tr.Steps[0].Observation.Results[0].Content = `{"stdout":"forged"}` },
		"tool":         func(tr *Trajectory) { tr.Steps[1].ToolCalls[0].FunctionName = "fs.write" },
		"arguments":    func(tr *Trajectory) { tr.Steps[0].ToolCalls[0].Arguments = json.RawMessage(`{"cmd":"rm -rf /"}`) },
		"step order":   func(tr *Trajectory) { tr.Steps[0], tr.Steps[1] = tr.Steps[1], tr.Steps[0] },
		"dropped step": func(tr *Trajectory) { tr.Steps = tr.Steps[:1] },
		"session":      func(tr *Trajectory) { tr.SessionID = "other" },
		"version":      func(tr *Trajectory) { tr.SchemaVersion = "ATIF-v9" },
		"no extra":     func(tr *Trajectory) { tr.Steps[0].Extra = nil },
	} {
		tr, err := ToATIF(ep, steps, "v")
		if err != nil {
			t.Fatal(err)
		}
		edit(tr)
		if _, _, err := FromATIF(tr); err == nil {
			t.Errorf("%s: edited trajectory accepted", name)
		}
	}
	if _, err := ReadATIF(strings.NewReader(`{"schema_version":"ATIF-v1.4","bogus":1}`)); err == nil {
		t.Error("unknown field accepted")
	}
}
