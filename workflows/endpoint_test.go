package workflows

import (
	"strings"
	"testing"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"

	_ "github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy" // registers the http policy
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

const httpStage = "stages:\n  - {env: shop, policies: http=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}%s}\n"

// A stage names the http policy's endpoint; every problem names its key, and a key
// where a credential's name belongs is refused.
func TestStageEndpointIsCheckedStrictly(t *testing.T) {
	for _, tt := range []struct {
		name, extra string
		want        []string
	}{
		{"missing", "", []string{"stages[0].policy_endpoint.url: policy http needs its model endpoint"}},
		{"not a URL", ", policy_endpoint: {url: 'ftp://x'}", []string{`stages[0].policy_endpoint.url: "ftp://x" is not an http(s) URL`}},
		{"a key in the URL", ", policy_endpoint: {url: 'https://u:p@h/v1'}", []string{"stages[0].policy_endpoint.url: carries a user and password"}},
		{"a key for a name", ", policy_endpoint: {url: 'http://h/v1', credential: sk-live-0123}", []string{`stages[0].policy_endpoint.credential: looks like a key`}},
		{"unknown key", ", policy_endpoint: {url: 'http://h/v1', api_key: sk-1}", []string{`unknown key "api_key"`}},
		{"bad type", ", policy_endpoint: {url: [1]}", []string{"stages[0].policy_endpoint.url:"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadSpec(strings.NewReader(strings.Replace(httpStage, "%s", tt.extra, 1)))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
	oracle := "stages:\n  - {env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}, policy_endpoint: {url: 'http://h/v1'}}\n"
	if _, err := LoadSpec(strings.NewReader(oracle)); err == nil || !strings.Contains(err.Error(), "stages[0].policy_endpoint: no policy of the run asks a model endpoint") {
		t.Errorf("an endpoint for a stage without the http policy: %v", err)
	}
}

// The stage's endpoint goes with each of its batches, into the run the batch submits,
// with its choice of token ids and logprobs.
func TestStageEndpointReachesItsRuns(t *testing.T) {
	f := &fakeBatches{rate: map[string]float64{"http=1": 1}}
	env := newEnv(t, f)
	env.ExecuteWorkflow(WorkflowCurriculum, specJSON(t, strings.Replace(httpStage, "%s",
		", policy_endpoint: {url: 'http://10.0.0.7:8000/v1', model: qwen3-8b, credential: lab-vllm, logprobs: false}", 1)), nil)
	if p := result(t, env); p.Status != StatusCompleted || len(f.calls) != 1 {
		t.Fatalf("got %+v after %d batches", p, len(f.calls))
	}
	req, err := f.calls[0].request()
	if err != nil {
		t.Fatal(err)
	}
	if ep := req.GetPolicyEndpoint(); ep.GetUrl() != "http://10.0.0.7:8000/v1" || ep.GetModel() != "qwen3-8b" || ep.GetCredential() != "lab-vllm" ||
		ep.GetLogprobs() != gauntletv1.Logprobs_LOGPROBS_OFF {
		t.Errorf("the batch's run names endpoint %v", ep)
	}
}

// A Batch workflow of the http policy names its endpoint, or is refused naming the field
// before any run is submitted.
func TestBatchEndpoint(t *testing.T) {
	s := newSuite(t)
	for _, c := range []struct {
		ep   *EndpointSpec
		want string
	}{
		{nil, "policy_endpoint.url: policy http needs its model endpoint"},
		{&EndpointSpec{URL: "http://h/v1", Credential: "a/b"}, `policy_endpoint.credential: "a/b" is not a credential name`},
		{&EndpointSpec{URL: "http://h/v1", Model: "m", Credential: "lab"}, ""},
	} {
		env := s.NewTestWorkflowEnvironment()
		env.RegisterWorkflowWithOptions(Batch, workflow.RegisterOptions{Name: WorkflowBatch})
		f := &fakeBatches{rate: map[string]float64{"http=1": 1}}
		env.RegisterActivityWithOptions(f.run, activity.RegisterOptions{Name: ActivityRunBatch})
		env.ExecuteWorkflow(WorkflowBatch, BatchSpec{Env: "shop", Policies: "http=1", Episodes: 4, PolicyEndpoint: c.ep})
		err := env.GetWorkflowError()
		switch {
		case c.want == "" && (err != nil || len(f.calls) != 1 || f.calls[0].PolicyEndpoint.Credential != "lab"):
			t.Errorf("%+v: %v, %d batches %+v", c.ep, err, len(f.calls), f.calls)
		case c.want != "" && (!IsInvalidSpec(err) || !strings.Contains(err.Error(), c.want) || len(f.calls) != 0):
			t.Errorf("%+v: %v after %d batches, want InvalidSpec naming %q", c.ep, err, len(f.calls), c.want)
		}
	}
}

// A Batch workflow started with a misspelt key (as the temporal CLI would start it) is
// refused naming the key, before any run is submitted: read loosely, the key was dropped
// and the batch ran with the field's default.
func TestBatchRefusesUnknownKeys(t *testing.T) {
	s := newSuite(t)
	for _, c := range []struct {
		input any
		want  string
	}{
		{map[string]any{"env": "shop", "policies": "oracle=1", "episodes": 4, "reward_sepc": "name: x"}, `unknown field "reward_sepc"`},
		{map[string]any{"env": "shop", "policies": "oracle=1", "episodes": 4, "policy_endpoint": map[string]any{"url": "http://h/v1", "modle": "m"}}, `unknown field "modle"`},
		{map[string]any{"env": "shop", "policies": "oracle=1", "episodes": "four"}, "episodes"},
		{map[string]any{"env": "shop", "policies": "oracle=1", "episodes": 4}, ""},
	} {
		env := s.NewTestWorkflowEnvironment()
		env.RegisterWorkflowWithOptions(Batch, workflow.RegisterOptions{Name: WorkflowBatch})
		f := &fakeBatches{rate: map[string]float64{"oracle=1": 1}}
		env.RegisterActivityWithOptions(f.run, activity.RegisterOptions{Name: ActivityRunBatch})
		env.ExecuteWorkflow(WorkflowBatch, c.input)
		err := env.GetWorkflowError()
		switch {
		case c.want == "" && (err != nil || len(f.calls) != 1 || f.calls[0].Episodes != 4):
			t.Errorf("%v: %v, %d batches", c.input, err, len(f.calls))
		case c.want != "" && (!IsInvalidSpec(err) || !strings.Contains(err.Error(), c.want) || len(f.calls) != 0):
			t.Errorf("%v: %v after %d batches, want InvalidSpec naming %q", c.input, err, len(f.calls), c.want)
		}
	}
}
