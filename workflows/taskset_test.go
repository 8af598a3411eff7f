package workflows

import (
	"strings"
	"testing"

	_ "github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
)

// TestStageTaskSetReachesTheRun: a stage that names a task set plays the tasks env with
// the set as its params, the stage's other params kept; the spec goes through the
// workflow's input unchanged.
func TestStageTaskSetReachesTheRun(t *testing.T) {
	s, err := LoadSpec(strings.NewReader(`
stages:
  - name: easy
    tasks: {dataset: gauntlet, difficulty: [easy], tags: [python], canary_rate: 0.02}
    params: {max_invalid: 3}
    policies: oracle=1
    episodes: {max: 10}
    promotion: {metric: success_rate, threshold: 1, window: 10}
  - name: medium
    tasks:
      dataset: gauntlet
      difficulty: [medium]
      glob: ["shell/*", "data/*"]
    policies: oracle=1
    episodes: {max: 10}
    promotion: {metric: success_rate, threshold: 1, window: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	in, err := EncodeSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseSpecJSON(in)
	if err != nil {
		t.Fatalf("the workflow's input: %v", err)
	}
	for i, want := range []string{
		`{"canary_rate":0.02,"dataset":"gauntlet","difficulty":["easy"],"max_invalid":3,"tags":["python"]}`,
		`{"dataset":"gauntlet","difficulty":["medium"],"glob":["shell/*","data/*"]}`,
	} {
		for _, sp := range []CurriculumSpec{s, again} {
			st := sp.Stages[i]
			req, err := st.runRequest("c-s0-b0", 1, 10, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if req.Env != "tasks" || req.ParamsJson != want {
				t.Errorf("stage %d: env %s, params %s; want tasks, %s", i, req.Env, req.ParamsJson, want)
			}
		}
	}
	// Pinned by `curriculum start`, the tasks go into the params, as `run --tasks` puts them.
	d := "sha256:" + strings.Repeat("a", 64)
	s.Stages[1].Tasks.Tasks = []TaskPin{{ID: "shell/backup-tar", Digest: d}}
	req, err := s.Stages[1].runRequest("c-s1-b0", 1, 10, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"dataset":"gauntlet","difficulty":["medium"],"glob":["shell/*","data/*"],"tasks":[{"id":"shell/backup-tar","digest":"` + d + `"}]}`; req.ParamsJson != want {
		t.Errorf("pinned stage's params %s, want %s", req.ParamsJson, want)
	}
}

// TestStageTaskSetRefused: a task set without a dataset, beside another env, beside
// params that would change its selection, or with a filter the tasks env refuses, is
// named by its key.
func TestStageTaskSetRefused(t *testing.T) {
	_, err := LoadSpec(strings.NewReader(`
stages:
  - {tasks: {tags: [python]}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
  - {env: shop, tasks: {dataset: gauntlet}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
  - {tasks: {dataset: gauntlet}, params: {task: codefix/sum}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
  - {tasks: {dataset: gauntlet, difficulty: [trivial]}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
  - {tasks: {dataset: gauntlet, colour: red}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
  - {tasks: {dataset: gauntlet, canary_rate: 3}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{
		"line 3: stages[0].tasks.dataset: required",
		`line 4: stages[1].env: "shop": a stage with tasks plays the tasks env`,
		"line 5: stages[2].params.task: the stage's tasks make the selection",
		`stages[3].params: tasks: params: difficulty "trivial" is not one of easy, medium, hard`,
		`line 7: unknown key "colour" in stages[4].tasks`,
		"stages[5].params: tasks: params.canary_rate: 3 is outside 0..1",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\ndoes not contain %q", err, w)
		}
	}
}
