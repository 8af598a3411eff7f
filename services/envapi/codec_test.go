package envapi

import (
	"strings"
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestStrictJSONRefusesUnknownFields(t *testing.T) {
	c := strictJSONCodecs[0]
	var req gauntletv1.StepRequest
	err := c.Unmarshal([]byte(`{"episodeId":"e","action":{"tool":"catalog.search","args":{"query":"mug"}}}`), &req)
	if err == nil || !strings.Contains(err.Error(), `unknown field "args"`) || !strings.Contains(err.Error(), "StepRequest") {
		t.Fatalf("unknown field: %v, want an error naming \"args\" and the message", err)
	}
	t.Log(err)
	in := &gauntletv1.StepRequest{EpisodeId: "e", Action: &gauntletv1.Action{Tool: "t", ArgsJson: "{}"},
		Trainer: &gauntletv1.TrainerData{CompletionTokenIds: []uint32{1}, Logprobs: []float32{-1}}}
	b, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out gauntletv1.StepRequest
	if err := c.Unmarshal(b, &out); err != nil || out.Trainer.GetLogprobs()[0] != -1 || out.Action.GetTool() != "t" {
		t.Fatalf("round trip of %s: %v %v", b, &out, err)
	}
	// Both the proto's JSON names and its field names are known.
	if err := c.Unmarshal([]byte(`{"episode_id":"e","action":{"tool":"t","args_json":"{}"}}`), &out); err != nil {
		t.Errorf("proto field names: %v", err)
	}
}
