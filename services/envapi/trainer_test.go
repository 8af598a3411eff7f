package envapi

import (
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/play"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Trainer data over its size limits is refused at the step, naming the limit: the step
// must fit one event under the stream's payload limit, and cutting token ids would leave
// misaligned rows.
func TestTrainerDataOverItsLimitsIsRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		td   *gauntletv1.TrainerData
		want string // "" accepted
	}{
		{"at the token limit", &gauntletv1.TrainerData{PromptTokenIds: make([]uint32, play.MaxTrainerTokens-2),
			CompletionTokenIds: []uint32{1, 2}, Logprobs: []float32{-1, -2}}, ""},
		{"over the token limit", &gauntletv1.TrainerData{PromptTokenIds: make([]uint32, play.MaxTrainerTokens),
			CompletionTokenIds: []uint32{1}}, "at most 262144 per step"},
		{"a long policy version", &gauntletv1.TrainerData{PolicyVersion: strings.Repeat("v", 5000)}, "trainer.policy_version: 5000 bytes"},
		{"misaligned logprobs still refused", &gauntletv1.TrainerData{CompletionTokenIds: []uint32{1}, Logprobs: []float32{-1, -1}}, "trainer.logprobs"},
	} {
		err := checkTrainer(c.td)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
