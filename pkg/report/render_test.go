package report

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// sample is a report as Build makes one, with a run label a user wrote.
func sample() *Report {
	r := &Report{Title: "runs r1, r2", GeneratedAt: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC), Database: "gauntlet",
		RunIDs: []string{"r1", "r2"}, Episodes: 200, Success: Wilson(90, 200), StuckBy: map[string]uint64{"max_steps": 3}, Stuck: 3}
	for i, id := range []string{"r1", "r2"} {
		r.ByRun = append(r.ByRun, Group{Key: id, Episodes: 100, Success: Wilson(uint64(40+10*i), 100),
			Run: &trajectory.RunRow{RunID: id, Label: `<script>alert("x")</script>`, Seed: uint64(i)}})
	}
	r.ByRun[1].Run.PolicyMix, r.ByRun[1].Run.PolicyLogprobs = "http=1", trajectory.LogprobsOn
	r.Limits = []Limit{{Kind: "oom_kill", Times: 4, Met: Wilson(1, 3), RewardMean: 0.25, Ended: 2, StepRewardMean: -0.5}}
	r.ByPolicy = []Group{{Key: "oracle", Episodes: 100, Success: Wilson(80, 100)}, {Key: "random", Episodes: 100, Success: Wilson(10, 100)}}
	r.Unfaulted = Wilson(50, 80)
	r.Faults = []FaultLine{{Kind: "latency", Met: Wilson(30, 70), First: Wilson(20, 50)}, {Kind: "http_error", Met: Wilson(10, 50), First: Wilson(10, 40)}}
	return r
}

// TestHTMLIsOneOfflineFile: the HTML report draws its charts inline, loads nothing, and
// escapes what users wrote (a run's label).
func TestHTMLIsOneOfflineFile(t *testing.T) {
	var b bytes.Buffer
	if err := Write(&b, sample(), FormatHTML); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if n := strings.Count(page, "<svg"); n != 4 {
		t.Errorf("%d charts; want 4 (by run, by policy, fault kinds met, first fault)", n)
	}
	if strings.Contains(page, "<script") {
		t.Error("the page carries a script: the label was not escaped, or something loads code")
	}
	for _, ref := range []string{"src=", "href=", "@import", "url("} {
		if strings.Contains(page, ref) {
			t.Errorf("the page refers to something outside it (%s)", ref)
		}
	}
	if !strings.Contains(page, "&lt;script&gt;") {
		t.Error("the run's label is missing from the page")
	}
}

func TestFormats(t *testing.T) {
	var table, js bytes.Buffer
	if err := Write(&table, sample(), FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Overview", "45.0 % [38.3, 51.9]", "By run", "http=1 (logprobs on)", "Under faults", "(no fault)", "Step latency", "stuck: max_steps",
		"Resource limits", "oom_kill", "33.3 % [6.1, 79.2]"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := Write(&js, sample(), FormatJSON); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Success != sample().Success || len(back.Faults) != 2 {
		t.Errorf("JSON does not read back: %v, %+v", err, back)
	}
	if err := Write(&js, sample(), "pdf"); err == nil || !strings.Contains(err.Error(), "pdf") {
		t.Errorf("unknown format: %v", err)
	}
}

// TestStagesShowInfraErrorsByKind: a curriculum report's stage transitions say how many
// of each stage's episodes ended as infra errors and of which kind, as the curriculum's
// progress did while the stage ran; a stage closed before kinds were recorded shows its
// count alone.
func TestStagesShowInfraErrorsByKind(t *testing.T) {
	r := sample()
	r.Stages = []trajectory.StageRow{
		{Stage: 0, StageName: "easy", Outcome: "promoted", Episodes: 40, InfraErrors: 12,
			InfraKinds: []string{"model_endpoint", "sandbox"}, InfraCounts: []uint64{10, 2}},
		{Stage: 1, StageName: "hard", Outcome: "not_promoted", Episodes: 20, InfraErrors: 3},
	}
	var b bytes.Buffer
	if err := Write(&b, r, FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"infra errors", "12 (model_endpoint 10, sandbox 2)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the stage transitions lack %q:\n%s", want, b.String())
		}
	}
}
