package main

import (
	"flag"
	"io"
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// gauntlet run --policy.http.logprobs names the run's choice of token ids and logprobs
// with its endpoint; without the flag the run leaves it to the workers' own.
func TestRunNamesLogprobs(t *testing.T) {
	for _, c := range []struct {
		args []string
		want gauntletv1.Logprobs
	}{
		{nil, gauntletv1.Logprobs_LOGPROBS_UNSPECIFIED},
		{[]string{"--policy.http.logprobs"}, gauntletv1.Logprobs_LOGPROBS_ON},
		{[]string{"--policy.http.logprobs=false"}, gauntletv1.Logprobs_LOGPROBS_OFF},
	} {
		var o runOpts
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.register(fs, 10)
		o.registerEndpoint(fs)
		if err := fs.Parse(append([]string{"--env", "shop", "--policies", "http=1", "--policy.http.url", "http://10.0.0.7:8000/v1"}, c.args...)); err != nil {
			t.Fatal(err)
		}
		req, err := o.request()
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := req.GetPolicyEndpoint().GetLogprobs(); got != c.want {
			t.Errorf("%v: the run asks %v, want %v", c.args, got, c.want)
		}
	}
}
