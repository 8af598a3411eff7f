package world

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// small is a valid world the error tests break one way at a time.
const small = `name: tiny
services: [svc]
vars:
  n: {type: int, uniform: [1, 5]}
tools:
  - name: bump
    service: svc
    description: add one to n
    args:
      type: object
      properties:
        by: {type: integer, minimum: 1, maximum: 3}
      required: [by]
    preconditions:
      - rule: below_ten
        require: n + args.by < 10
        error: too big
        reason: n is ${n}
        suggestion: stop bumping
    effects:
      - set: n
        to: n + args.by
    observation:
      n: n
success: n >= 9
`

func TestSmallWorldLoads(t *testing.T) {
	w, err := Load("tiny.yaml", []byte(small))
	if err != nil {
		t.Fatal(err)
	}
	if w.Name() != "tiny" || !strings.HasPrefix(w.Digest(), "sha256:") || w.HasOracle() {
		t.Fatalf("got %s %s %v", w.Name(), w.Digest(), w.HasOracle())
	}
	spec := w.Env().Spec()
	if got, want := string(spec.Tools[0].Schema), `{"additionalProperties":false,"properties":{"by":{"maximum":3,"minimum":1,"type":"integer"}},"required":["by"],"type":"object"}`; got != want {
		t.Fatalf("schema\n got %s\nwant %s", got, want)
	}
}

// TestLoadReportsEveryErrorWithItsPlace: each broken file reports all its problems at
// once, each naming the file, the line and the field.
func TestLoadReportsEveryErrorWithItsPlace(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		want []string // each a regexp one error line must match
	}{
		{"unknown keys everywhere", strings.Replace(strings.Replace(small, "services: [svc]", "services: [svc]\ncolour: red", 1),
			"    service: svc", "    service: svc\n    sevrice: x", 1),
			[]string{`^w\.yaml:3:1: colour: unknown key`, `^w\.yaml:9:5: tools\[0\]\.sevrice: unknown key`}},
		{"type errors in CEL", strings.Replace(strings.Replace(small, "to: n + args.by", "to: n + args.byy", 1),
			"success: n >= 9", "success: n + 1", 1),
			[]string{`^w\.yaml:\d+:\d+: tools\[0\]\.effects\[0\]\.to: undefined field 'byy'`, `^w\.yaml:25:10: success: .* has type int, want bool`}},
		{"unknown service and variable", strings.Replace(strings.Replace(small, "service: svc", "service: nope", 1),
			"- set: n", "- set: m", 1),
			[]string{`^w\.yaml:7:14: tools\[0\]\.service: unknown service "nope"`, `^w\.yaml:\d+:14: tools\[0\]\.effects\[0\]\.set: unknown variable "m"`}},
		{"unknown key in a variable and a field", strings.Replace(small, "n: {type: int, uniform: [1, 5]}", "n: {type: int, uniform: [1, 5], colour: red}\nentities: {e: {prefix: e-, count: {value: 1, size: 2}, fields: {f: {type: int, value: 1, colour: blue}}}}", 1),
			[]string{`^w\.yaml:4:35: vars\.n\.colour: unknown key`, `entities\.e\.count\.size: unknown key`, `entities\.e\.fields\.f\.colour: unknown key`}},
		{"missing required keys", "services: [a]\n", []string{`name: required`, `tools: required`, `success: required`}},
		{"rule without reason", strings.Replace(small, "        reason: n is ${n}\n", "", 1),
			[]string{`tools\[0\]\.preconditions\[0\]: a rule .* needs a reason and a suggestion`}},
		{"bad schema keyword", strings.Replace(small, "minimum: 1, maximum: 3", "minimum: 1, pattern: x", 1),
			[]string{`tools\[0\]\.args\.properties\.by\.pattern: unknown key`}},
		{"draw reads a later value", strings.Replace(small, "n: {type: int, uniform: [1, 5]}", "n: {type: int, expr: m}\n  m: {type: int, value: 2}", 1),
			[]string{`^w\.yaml:4:\d+: vars\.n\.expr: seed 1: no such attribute`}},
		{"malformed YAML", "name: [x\n", []string{`^w\.yaml:\d+:1: \(document\): malformed YAML`}},
		{"not a mapping", "- a\n- b\n", []string{`^w\.yaml:1:1: \(document\): want a mapping`}},
		{"empty", "", []string{`empty file`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("w.yaml", []byte(tc.file))
			if err == nil {
				t.Fatal("loaded")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			lines := strings.Split(err.Error(), "\n")
			seen := map[string]bool{}
			for _, l := range lines {
				if seen[l] {
					t.Errorf("error reported twice: %s", l)
				}
				seen[l] = true
			}
			for _, w := range tc.want {
				re := regexp.MustCompile(w)
				found := false
				for _, l := range lines {
					if re.MatchString(l) {
						found = true
					}
				}
				if !found {
					t.Errorf("no error matches %s in:\n%s", w, err)
				}
			}
		})
	}
}

// TestEndConditionsOnTheClock: an end condition that reads the clock is checked after
// every step, even one that changes nothing; one that reads only the state is not
// needed there and its verdict is the same.
func TestEndConditionsOnTheClock(t *testing.T) {
	src := strings.Replace(small, "success: n >= 9", "success: now_ms >= 500", 1)
	src = strings.Replace(src, "tools:\n", "tools:\n  - name: wait\n    description: let time pass\n    args: {type: object, properties: {ms: {type: integer, minimum: 1, maximum: 1000}}, required: [ms]}\n    advance_ms: args.ms\n", 1)
	w, err := Load("clock.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !w.endsReadClock {
		t.Fatal("success reads now_ms but is not checked on every step")
	}
	ep, err := w.Env().NewEpisode(env.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		r, err := ep.Step(env.Action{Tool: "wait", Args: []byte(`{"ms":200}`)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Done() != (i == 2) || r.Signals.Success != (i == 2) {
			t.Fatalf("step %d (clock %v): done %v success %v", i, ep.Now(), r.Done(), r.Signals.Success)
		}
	}
	plain, _ := Load("tiny.yaml", []byte(small))
	if plain.endsReadClock {
		t.Fatal("success reads only n but is marked as reading the clock")
	}
}

// TestAliasBomb: aliases of aliases that would make a small file check (and compile)
// hundreds of thousands of expressions are refused at once, not walked.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: bomb\nservices: [s]\nvars: {n: {type: int, value: 1}}\nsuccess: 'n > 1'\n")
	b.WriteString("p: &p {require: 'n + 1 > 0', error: e}\nps: &ps [" + strings.Repeat("*p, ", 299) + "*p]\n")
	b.WriteString("tool: &t {name: t, description: d, preconditions: *ps}\ntools: [" + strings.Repeat("*t, ", 299) + "*t]\n")
	start := time.Now()
	_, err := Load("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "expands to more than") {
		t.Fatalf("got %.300v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("refusing took %v", d)
	}
}

func TestTemplateBraces(t *testing.T) {
	for s, want := range map[string]int{"x}": 1, "'}' + y}": 7, `"a\"}" }`: 7, "{'a': 1}['a']} tail": 13, "'unclosed": -1, "{": -1} {
		if got := closingBrace(s); got != want {
			t.Errorf("closingBrace(%q) = %d, want %d", s, got, want)
		}
	}
	src := strings.Replace(small, "reason: n is ${n}", "reason: \"n is ${ {'v': n}['v'] } and ${'}'}\"", 1)
	w, err := Load("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	args := newObject(w.tools[0].args.otype)
	args.vals[0] = types.Int(1)
	got, err := render(w.tools[0].pre[0].reason, &activation{ep: &episode{w: w, vars: []ref.Val{types.Int(7)}}, args: args})
	if err != nil || got != "n is 7 and }" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestToolWithoutArgsHasASchema: a tool that declares no args publishes the empty
// object's schema (the env API's action space needs one for every tool).
func TestToolWithoutArgsHasASchema(t *testing.T) {
	w, _ := Of(bank(t))
	for _, tl := range w.Env().Spec().Tools {
		if tl.Name == "account.list" {
			if got, want := string(tl.Schema), `{"additionalProperties":false,"properties":{},"type":"object"}`; got != want {
				t.Fatalf("schema %s, want %s", got, want)
			}
			return
		}
	}
	t.Fatal("no account.list")
}

// TestParseFlatAgreesWithParse: the hot path of argument parsing accepts only what the
// encoding/json path accepts, with the same values, and leaves every error to it.
func TestParseFlatAgreesWithParse(t *testing.T) {
	w, err := Load("t.yaml", []byte(strings.Replace(small, "        by: {type: integer, minimum: 1, maximum: 3}",
		"        by: {type: integer, minimum: 1, maximum: 3}\n        s: {type: string, maxLength: 4, minLength: 1, enum: [ab, abc, abcd, \"a b\"]}\n        f: {type: boolean}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	sc := &w.tools[0].args
	inputs := []string{`{"by":1}`, ` { "by" : 2 , "s" : "ab" , "f" : true } `, `{"by":3,"f":false}`, `{"by":0}`, `{"by":4}`,
		`{"by":01}`, `{"by":-0}`, `{"by":1.0}`, `{"by":1e0}`, `{"by":"1"}`, `{"by":1,"by":2}`, `{"by":1,}`, `{"by":1}x`,
		`{"s":"ab"}`, `{"by":1,"s":"abcde"}`, `{"by":1,"s":""}`, `{"by":1,"s":"zz"}`, `{"by":1,"s":"a\u0062"}`, `{"by":1,"s":"a b"}`,
		`{"by":1,"x":1}`, `{"by":1,"f":truex}`, `{"by":1,"f":tru}`, `{}`, ``, `null`, `[]`, `{"by":1`, `{"by":9223372036854775808}`,
		`{"by":-1}`, `{"by": 2}`, "{\"by\":2}\n", `{"by":1,"f":null}`}
	for _, in := range inputs {
		fast, ok := sc.parseFlat([]byte(in))
		slow, err := sc.parseJSON([]byte(in))
		if !ok {
			continue
		}
		if err != nil {
			t.Errorf("%s: the hot path accepts what parse refuses: %v", in, err)
			continue
		}
		if fast.Equal(slow) != types.True {
			t.Errorf("%s: hot path %v, parse %v", in, fast.vals, slow.vals)
		}
	}
	if _, ok := sc.parseFlat([]byte(`{"by":2,"s":"abc","f":true}`)); !ok {
		t.Error("the hot path refuses plain arguments")
	}
}

// TestEndConditionsFollowTheirReads: a step re-evaluates only the end conditions that
// read what its tool writes; the others keep their verdicts, which stay right.
func TestEndConditionsFollowTheirReads(t *testing.T) {
	src := `name: deps
services: [s]
vars:
  a: {type: int, value: 0}
  b: {type: int, value: 0}
tools:
  - {name: inc_a, description: add one to a, effects: [{set: a, to: a + 1}], observation: {a: a}}
  - {name: inc_b, description: add one to b, effects: [{set: b, to: b + 1}], observation: {b: b}}
progress: [a >= 1, b >= 1]
success: b >= 2
`
	w, err := Load("deps.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := w.Env().NewEpisode(env.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	e := ep.(*episode)
	for i, tc := range []struct {
		tool     string
		progress float64
		success  bool
		// known: which of success, failure, a >= 1, b >= 1 hold a verdict after the step.
		known [4]bool
	}{
		{"inc_a", 0.5, false, [4]bool{true, false, true, true}},
		{"inc_a", 0.5, false, [4]bool{true, false, false, true}}, // a changed; the milestones above progress are checked
		{"inc_b", 1, false, [4]bool{true, false, false, true}},
		{"inc_a", 1, false, [4]bool{true, false, false, true}}, // b unchanged: success not evaluated again
		{"inc_b", 1, true, [4]bool{true, false, false, false}},
	} {
		r, err := ep.Step(env.Action{Tool: tc.tool})
		if err != nil {
			t.Fatal(err)
		}
		if r.Signals.Progress != tc.progress || r.Signals.Success != tc.success || [4]bool(e.known) != tc.known {
			t.Fatalf("step %d %s: progress %v success %v known %v, want %v %v %v", i, tc.tool, r.Signals.Progress, r.Signals.Success, e.known, tc.progress, tc.success, tc.known)
		}
	}
}

// TestSchemaIsCanonical: a tool's published schema is canonical JSON, its properties'
// keys sorted like every other object's, whatever order the file declares them in (the
// Go shop publishes {"qty":...,"sku":...}; the shop port declared sku first).
func TestSchemaIsCanonical(t *testing.T) {
	src := strings.Replace(small, "        by: {type: integer, minimum: 1, maximum: 3}",
		"        zeta: {type: string, maxLength: 4}\n        by: {type: integer, minimum: 1, maximum: 3}", 1)
	w, err := Load("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	got := string(w.Env().Spec().Tools[0].Schema)
	var v any
	if err := json.Unmarshal([]byte(got), &v); err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(v) // encoding/json writes map keys sorted
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("schema %s\nwant     %s", got, want)
	}
}
