package runs_test

import (
	"math"
	"strings"
	"testing"

	_ "github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy" // registers the http policy
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A run is refused with every problem at once, each naming its field, so the CLI and
// the scheduler give the same complete answer; a valid run passes.
func TestValidateReportsEveryProblem(t *testing.T) {
	valid := func() *gauntletv1.RunRequested {
		return &gauntletv1.RunRequested{RunId: "r1", Env: "shop", Episodes: 10, MaxInFlight: 2, MaxSteps: 40,
			Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 1}, {Name: "random", Weight: 2}},
			Profiles: []*gauntletv1.Share{{Name: "stress", Weight: 1}}}
	}
	if err := runs.Validate(valid()); err != nil {
		t.Fatalf("a valid run: %v", err)
	}
	bad := &gauntletv1.RunRequested{RunId: "r.1", Env: "nope", ParamsJson: "{", Episodes: 0, MaxInFlight: 0,
		MaxSteps: runs.MaxStepsLimit + 1,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 0}, {Name: "oracle", Weight: 0}, {Name: "psychic", Weight: 0}},
		Profiles: []*gauntletv1.Share{{Name: "chaos", Weight: 1}}}
	err := runs.Validate(bad)
	for _, want := range []string{
		"run_id", "env: ", "params: not valid JSON", "policies[1]: oracle listed twice", "policies[2]: ",
		"policies: weights add up to zero", `unknown profile "chaos"`, "episodes: 0 is outside", "max_in_flight: must be at least 1",
		"max_steps: 100001 is more than 100000",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate of a run wrong everywhere lacks %q:\n%v", want, err)
		}
	}

	for name, change := range map[string]func(*gauntletv1.RunRequested){
		"no policy":         func(r *gauntletv1.RunRequested) { r.Policies = nil },
		"too many episodes": func(r *gauntletv1.RunRequested) { r.Episodes = runs.MaxEpisodes + 1 },
		"bad env params":    func(r *gauntletv1.RunRequested) { r.ParamsJson = `{"no_such_param": 1}` },
	} {
		r := valid()
		change(r)
		if err := runs.Validate(r); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Share lists parse as people write them, name the element that is wrong, and print back
// to what parses to the same shares.
func TestShares(t *testing.T) {
	got, err := runs.ParseShares("policies", " oracle=3, random ")
	if err != nil || runs.FormatShares(got) != "oracle=3,random=1" {
		t.Fatalf("ParseShares = %v, %v", got, err)
	}
	again, err := runs.ParseShares("policies", runs.FormatShares(got))
	if err != nil || runs.FormatShares(again) != runs.FormatShares(got) {
		t.Errorf("round trip: %v, %v", again, err)
	}
	if got, err := runs.ParseShares("policies", "  "); got != nil || err != nil {
		t.Errorf("empty list: %v, %v", got, err)
	}
	for in, want := range map[string]string{
		"oracle=3,=1":      "policies[1]: empty name",
		"oracle=x":         `policies[0]: weight "x" of oracle is not a whole number`,
		"a=1,b=4294967296": `policies[1]: weight "4294967296" of b`,
	} {
		if _, err := runs.ParseShares("policies", in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseShares(%q) = %v, want %q", in, err, want)
		}
	}
}

// A run's rates are plain numbers before any episode ended, never NaN.
func TestRatesBeforeAnyEnd(t *testing.T) {
	if r := runs.SuccessRate(&gauntletv1.RunProgress{}); r != 0 {
		t.Errorf("success rate of nothing ended: %v", r)
	}
	if r := runs.MeanReward(&gauntletv1.RunProgress{RewardSum: math.NaN()}); r != 0 {
		t.Errorf("mean reward of nothing ended: %v", r)
	}
	p := &gauntletv1.RunProgress{Ended: 4, Succeeded: 1, RewardSum: 2}
	if runs.SuccessRate(p) != 0.25 || runs.MeanReward(p) != 0.5 {
		t.Errorf("rates of %v: %v %v", p, runs.SuccessRate(p), runs.MeanReward(p))
	}
}

// Infra errors carry no reward: a run's success rate and mean reward are over the
// episodes that did not end as one.
func TestRatesLeaveInfraErrorsOut(t *testing.T) {
	p := &gauntletv1.RunProgress{Ended: 10, InfraErrors: 6, Succeeded: 1, RewardSum: 2}
	if runs.SuccessRate(p) != 0.25 || runs.MeanReward(p) != 0.5 {
		t.Errorf("rates of %v: success %v, reward %v; want 0.25 and 0.5, over the 4 episodes scored", p, runs.SuccessRate(p), runs.MeanReward(p))
	}
	all := &gauntletv1.RunProgress{Ended: 3, InfraErrors: 3}
	if runs.SuccessRate(all) != 0 || runs.MeanReward(all) != 0 {
		t.Errorf("rates of a run of infra errors only: %v %v", runs.SuccessRate(all), runs.MeanReward(all))
	}
}

// A run naming the http policy without its model endpoint is refused when submitted,
// naming the field, instead of recording every episode as an infra error; the endpoint
// travels with each of its episodes.
func TestHTTPPolicyRunNeedsItsEndpoint(t *testing.T) {
	run := func(policies string, ep *gauntletv1.PolicyEndpoint) *gauntletv1.RunRequested {
		pol, err := runs.ParseShares("policies", policies)
		if err != nil {
			t.Fatal(err)
		}
		return &gauntletv1.RunRequested{RunId: "r1", Env: "shop", Episodes: 4, MaxInFlight: 2, Policies: pol, PolicyEndpoint: ep}
	}
	for _, c := range []struct {
		policies string
		ep       *gauntletv1.PolicyEndpoint
		want     string // "" for valid
	}{
		{"random=1,http=1", nil, "policy_endpoint.url: policy http needs its model endpoint (gauntlet run --policy.http.url URL)"},
		{"http=1", &gauntletv1.PolicyEndpoint{Model: "m"}, "policy_endpoint.url: policy http needs its model endpoint"},
		{"http=1", &gauntletv1.PolicyEndpoint{Url: "ftp://x"}, `policy_endpoint.url: "ftp://x" is not an http(s) URL`},
		{"oracle=1", &gauntletv1.PolicyEndpoint{Url: "http://127.0.0.1:1/v1"}, "policy_endpoint: no policy of the run asks a model endpoint"},
		{"http=1", &gauntletv1.PolicyEndpoint{Url: "http://127.0.0.1:1/v1", Model: "m"}, ""},
		{"oracle=1", nil, ""},
	} {
		err := runs.Validate(run(c.policies, c.ep))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s with %v: refused: %v", c.policies, c.ep, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s with %v: %v, want %q", c.policies, c.ep, err, c.want)
		}
	}
	r := run("http=1", &gauntletv1.PolicyEndpoint{Url: "http://127.0.0.1:1/v1", Model: "m"})
	if ep := runs.Episode(r, 3).GetPolicyEndpoint(); ep.GetUrl() != "http://127.0.0.1:1/v1" || ep.GetModel() != "m" {
		t.Errorf("episode 3's endpoint: %v", ep)
	}
}

// The endpoint is recorded with the run (its events, the runs table, a curriculum's
// Temporal history): no part of it may carry a key, and each problem names its field.
func TestPolicyEndpointCarriesNoSecret(t *testing.T) {
	pol, err := runs.ParseShares("policies", "http=1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ep   *gauntletv1.PolicyEndpoint
		want string // "" for valid
	}{
		{&gauntletv1.PolicyEndpoint{Url: "https://10.0.0.7:8000/v1", Model: "qwen3-8b", Credential: "lab-vllm.key"}, ""},
		{&gauntletv1.PolicyEndpoint{Url: "https://api.example/v1?api-version=2024-10-01"}, ""},
		{&gauntletv1.PolicyEndpoint{Url: "https://user:sk-123@api.example/v1"}, "policy_endpoint.url: carries a user and password; name a credential instead (policy_endpoint.credential)"},
		{&gauntletv1.PolicyEndpoint{Url: "https://api.example/v1?api_key=sk-1"}, `policy_endpoint.url: its query parameter "api_key" may carry a key`},
		{&gauntletv1.PolicyEndpoint{Url: "http:///v1"}, `policy_endpoint.url: "http:///v1" names no host`},
		{&gauntletv1.PolicyEndpoint{Url: "http://h/v1", Logprobs: gauntletv1.Logprobs_LOGPROBS_OFF}, ""},
		{&gauntletv1.PolicyEndpoint{Url: "http://h/v1", Logprobs: 7}, "policy_endpoint.logprobs: 7 is none of unspecified, on, off"},
		{&gauntletv1.PolicyEndpoint{Url: "http://h/v1", Credential: "sk-abcdef0123"}, `policy_endpoint.credential: looks like a key (it starts with "sk-")`},
		{&gauntletv1.PolicyEndpoint{Url: "http://h/v1", Credential: "../etc/passwd"}, `policy_endpoint.credential: "../etc/passwd" is not a credential name`},
		{&gauntletv1.PolicyEndpoint{Url: "http://h/v1", Model: strings.Repeat("m", 300)}, "policy_endpoint.model: 300 bytes is longer than 256"},
		{&gauntletv1.PolicyEndpoint{Url: "http://h/v1", Model: "m\n"}, `policy_endpoint.model: "m\n" has control characters`},
		{&gauntletv1.PolicyEndpoint{Credential: "lab"}, "policy_endpoint.url: policy http needs its model endpoint"},
	} {
		err := runs.Validate(&gauntletv1.RunRequested{RunId: "r1", Env: "shop", Episodes: 4, MaxInFlight: 2, Policies: pol, PolicyEndpoint: c.ep})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: refused: %v", c.ep, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want %q", c.ep, err, c.want)
		}
	}
}
