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
