package env_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// TestDecodeParams: the one strict params decoder sets what it is given, in sorted order,
// and names every problem at once with its field.
func TestDecodeParams(t *testing.T) {
	known := func() []string { return []string{"top", "deadline_ms", "a"} }
	for _, tt := range []struct {
		raw, set, err string
	}{
		{``, "", ""},
		{` null `, "", ""},
		{`{}`, "", ""},
		{" {  \n\t} ", "", ""},
		{`{`, "", "params: malformed JSON: unexpected end of JSON input"},
		{`{}}`, "", "params: malformed JSON: invalid character '}' after top-level value"},
		{`{ } }`, "", "params: malformed JSON: invalid character '}' after top-level value"},
		{`{"a": {}}`, "a={} ", ""},
		{`{"top": 3, "a": 1}`, "a=1 top=3 ", ""},
		{`[1]`, "", "params: want object, got array"},
		{`"x"`, "", "params: want object, got string"},
		{`{"top":`, "", "params: malformed JSON: unexpected end of JSON input"},
		{`{"zed": 1, "top": "x", "a": 2}`, "a=2 ",
			"params.top: bad value \"x\"\nparams.zed: unknown parameter (known: a, deadline_ms, top)"},
		{`{"` + strings.Repeat("k", 70) + `": 1}`, "",
			"params." + strings.Repeat("k", 64) + "…: unknown parameter (known: a, deadline_ms, top)"},
	} {
		var set strings.Builder
		err := env.DecodeParams(json.RawMessage(tt.raw), func(k string, v json.RawMessage) error {
			switch k {
			case "top", "deadline_ms", "a":
			default:
				return env.ErrUnknownParam
			}
			if v[0] == '"' {
				return fmt.Errorf("bad value %s", v)
			}
			fmt.Fprintf(&set, "%s=%s ", k, v)
			return nil
		}, known)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.err || set.String() != tt.set {
			t.Errorf("DecodeParams(%s) = %q, set %q; want %q, set %q", tt.raw, got, set.String(), tt.err, tt.set)
		}
	}
}

// TestDecodeParamsKnownOnlyWhenNeeded: the known names are asked for only to report an
// unknown one.
func TestDecodeParamsKnownOnlyWhenNeeded(t *testing.T) {
	calls := 0
	known := func() []string { calls++; return []string{"a"} }
	err := env.DecodeParams(json.RawMessage(`{"a": 1}`), func(string, json.RawMessage) error { return nil }, known)
	if err != nil || calls != 0 {
		t.Fatalf("err %v, known called %d times; want nil, 0", err, calls)
	}
	err = env.DecodeParams(json.RawMessage(`{"b": 1}`), func(string, json.RawMessage) error {
		return fmt.Errorf("wrapped: %w", env.ErrUnknownParam)
	}, known)
	if err == nil || err.Error() != "params.b: unknown parameter (known: a)" || calls != 1 {
		t.Fatalf("err %v, known called %d times", err, calls)
	}
	if errors.Is(err, env.ErrUnknownParam) {
		t.Errorf("the reported error wraps ErrUnknownParam; it names the field instead")
	}
}

func TestJSONKind(t *testing.T) {
	for raw, want := range map[string]string{``: "nothing", `"a"`: "string", `{}`: "object", `[]`: "array",
		`true`: "boolean", `false`: "boolean", `null`: "null", `-1`: "number", `7`: "number", `x`: "invalid JSON"} {
		if got := env.JSONKind([]byte(raw)); got != want {
			t.Errorf("JSONKind(%q) = %q, want %q", raw, got, want)
		}
	}
}

// TestIntParams: a Go env's integer params give its spec (bounds in the description) and
// decode a request from their defaults, every problem named with its field.
func TestIntParams(t *testing.T) {
	type params struct{ n, m int64 }
	ps := env.IntParams[params]{
		{Name: "n", Default: 3, Min: 1, Max: 9, Description: "how many", Set: func(p *params, v int64) { p.n = v }},
		{Name: "m", Default: -1, Min: -1, Max: 5, Description: "which", Set: func(p *params, v int64) { p.m = v }},
	}
	spec := fmt.Sprint(ps.Spec())
	if want := "[{n int 3 how many (1..9)} {m int -1 which (-1..5)}]"; spec != want {
		t.Errorf("Spec() = %s, want %s", spec, want)
	}
	value := func(v json.RawMessage, min, max int64) (int64, error) {
		var n int64
		if err := json.Unmarshal(v, &n); err != nil || n < min || n > max {
			return 0, fmt.Errorf("%s is not in %d..%d", v, min, max)
		}
		return n, nil
	}
	for _, tt := range []struct {
		raw  string
		want params
		err  string
	}{
		{``, params{3, -1}, ""},
		{`{"m": 5}`, params{3, 5}, ""},
		{`{"n": 10, "m": 0, "k": 1}`, params{3, 0}, "params.k: unknown parameter (known: m, n)\nparams.n: 10 is not in 1..9"},
	} {
		got, err := ps.Decode(json.RawMessage(tt.raw), value)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if got != tt.want || msg != tt.err {
			t.Errorf("Decode(%s) = %+v, %q; want %+v, %q", tt.raw, got, msg, tt.want, tt.err)
		}
	}
}
