package codefix_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
)

// TestParamsChecked: a request's params are decoded strictly, every problem named with its
// field at once; no sandbox is needed to check them.
func TestParamsChecked(t *testing.T) {
	for _, tt := range []struct {
		params string
		want   []string // substrings of the error; none: valid
	}{
		{``, nil},
		{`null`, nil},
		{`{"variant":0,"cases":5,"memory_mb":16,"docs":1}`, nil},
		{`{"variant":99,"nope":1}`, []string{"params.nope: unknown parameter (known: cases, deadline_ms, docs, exec_timeout_ms, max_invalid, memory_mb, variant)",
			"params.variant: 99 is outside -1.."}},
		{`{"cases":"x","docs":2}`, []string{`params.cases: want an integer, got "x"`, "params.docs: 2 is outside 0..1"}},
		{`[1]`, []string{"params: want object, got array"}},
		{`{"cases":`, []string{"params: malformed JSON"}},
	} {
		_, err := codefix.New().NewEpisode(env.Config{Params: json.RawMessage(tt.params)})
		if (err == nil) != (tt.want == nil) {
			t.Errorf("params %s: error %v", tt.params, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("params %s: error %q lacks %q", tt.params, err, w)
			}
		}
	}
}
