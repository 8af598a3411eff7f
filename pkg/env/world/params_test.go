package world

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// withParams is small with params that its draws, its answers and an entity count read.
var withParams = strings.Replace(small, "vars:\n  n: {type: int, uniform: [1, 5]}\n", `params:
  top: {type: int, default: 5, min: 1, max: 50, description: largest n drawn}
  boxes: {type: int, default: 2, min: 0, max: 30, description: boxes at the start}
  loud: {type: bool, default: false, description: answers shout}
  mood: {type: string, default: calm, one_of: [calm, grim], description: the world's mood}
vars:
  n: {type: int, uniform: [1, top]}
entities:
  box: {prefix: b-, count: {expr: boxes}, fields: {w: {type: int, uniform: [1, top]}}}
`, 1)

func init() {
	withParams = strings.Replace(withParams, "    observation:\n      n: n\n", "    observation:\n      n: n\n      boxes: size(box)\n      loud: loud\n      mood: mood\n", 1)
}

// TestParamsReachDrawsAndAnswers: a request's params change what the episode draws and
// answers; the defaults hold when it sets none; the spec lists them with their bounds.
func TestParamsReachDrawsAndAnswers(t *testing.T) {
	w, err := Load("p.yaml", []byte(withParams))
	if err != nil {
		t.Fatal(err)
	}
	e := w.Env()
	play := func(params string) map[string]any {
		t.Helper()
		ep, err := e.NewEpisode(env.Config{Seed: 3, Params: json.RawMessage(params)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		r, err := ep.Step(env.Action{Tool: "bump", Args: json.RawMessage(`{"by":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		var obs map[string]any
		if err := json.Unmarshal(r.Observation, &obs); err != nil {
			t.Fatal(err)
		}
		return obs
	}
	def := play("")
	if def["boxes"] != 2.0 || def["loud"] != false || def["mood"] != "calm" {
		t.Fatalf("defaults: %v", def)
	}
	set := play(`{"boxes":7,"loud":true,"mood":"grim","top":1,"max_invalid":3}`)
	// top 1 draws n = 1, so one bump makes it 2.
	if set["boxes"] != 7.0 || set["loud"] != true || set["mood"] != "grim" || set["n"] != 2.0 {
		t.Fatalf("set: %v", set)
	}
	var got []string
	for _, p := range e.Spec().Params {
		got = append(got, p.Name+" "+p.Type+" "+p.Default+" "+p.Description)
	}
	want := []string{
		"top int 5 largest n drawn (1..50)",
		"boxes int 2 boxes at the start (0..30)",
		"loud bool false answers shout",
		"mood string calm the world's mood (one of calm, grim)",
		"deadline_ms int 60000 virtual milliseconds the episode may take (100..86400000)",
		"max_invalid int 5 invalid actions that terminate the episode (1..1000)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("spec params\n got %q\nwant %q", got, want)
	}
	var desc strings.Builder
	if err := w.Describe(&desc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(desc.String(), "params (set by the episode's request):\n  top int = 5 by default  # largest n drawn (1..50)\n") {
		t.Fatalf("describe:\n%s", desc.String())
	}
}

// TestParamsRequestChecked: a request's params are held to their declarations, every
// problem named at once.
func TestParamsRequestChecked(t *testing.T) {
	w, err := Load("p.yaml", []byte(withParams))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Env().NewEpisode(env.Config{Params: json.RawMessage(`{"top":51,"loud":1,"mood":"glad","size":3,"boxes":2.5}`)})
	if err == nil {
		t.Fatal("bad params accepted")
	}
	for _, want := range []string{
		`params.boxes: want integer, got number 2.5`,
		`params.loud: want true or false, got number`,
		`params.mood: "glad" is not one of calm, grim`,
		`params.size: unknown parameter (known: boxes, deadline_ms, loud, max_invalid, mood, top)`,
		`params.top: 51 is outside [1,50]`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestParamsDeclarationsChecked: a bad declaration is named by file, line and field, all
// at once.
func TestParamsDeclarationsChecked(t *testing.T) {
	file := strings.Replace(small, "vars:\n", `params:
  a: {type: int, default: 9, min: 1, max: 5, description: over its max}
  b: {type: int, default: 1, description: no bounds}
  c: {type: float, default: 1, description: unknown type}
  d: {type: string, default: 3, description: not a string}
  e: {type: bool, default: true}
  n: {type: int, default: 1, min: 0, max: 2, description: "a param: no variable takes its name, no tool sets it"}
  step: {type: int, default: 1, min: 0, max: 2, description: the clock's}
  f: {type: int, default: 1, min: 3, max: 2, description: empty}
  g: {type: bool, default: false, max: 3, description: a bound on a bool, colour: red}
vars:
`, 1)
	file = strings.Replace(file, "    effects:\n      - set: n\n", "    effects:\n      - set: a\n        to: a + 1\n      - set: n\n", 1)
	_, err := Load("w.yaml", []byte(file))
	if err == nil {
		t.Fatal("bad params accepted")
	}
	for _, want := range []string{
		`w\.yaml:4:\d+: params\.a\.default: 9 is outside \[1,5\]`,
		`w\.yaml:5:\d+: params\.b\.min: required: min and max`,
		`w\.yaml:6:\d+: params\.c\.type: unknown type "float"`,
		`w\.yaml:7:\d+: params\.d\.default: want string, got number`,
		`w\.yaml:8:\d+: params\.e\.description: required`,
		`w\.yaml:\d+:\d+: vars\.n: name "n" is already declared`,
		`w\.yaml:10:\d+: params\.step: bad name "step"`,
		`w\.yaml:11:\d+: params\.f\.max: max 2 is below min 3`,
		`w\.yaml:12:\d+: params\.g\.max: max is for a param of type int`,
		`w\.yaml:12:\d+: params\.g\.colour: unknown key`,
		`w\.yaml:\d+:\d+: tools\[0\]\.effects\[1\]\.set: n is a param`,
		// a's default is wrong, but a is declared: what reads it is checked, not
		// reported as reading an undeclared name.
		`w\.yaml:\d+:\d+: tools\[0\]\.effects\[0\]\.set: a is a param`,
	} {
		if !regexp.MustCompile(`(?m)` + want).MatchString(err.Error()) {
			t.Errorf("no error matches %s:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "undeclared reference") {
		t.Errorf("a param with a wrong default is reported as undeclared:\n%v", err)
	}
}

// TestDrawnCountBoundsCost: an entity count that is drawn (not a literal) bounds the
// collection by the range a count is checked against, so an expression whose cost grows
// with the collection is not taken as cheap. The count's default of 0 used to stay next
// to the draw and bound such a collection at 0: the nested all below, 10,000² element
// visits at worst, ran without cost tracking.
func TestDrawnCountBoundsCost(t *testing.T) {
	for _, count := range []string{"{uniform: [1, 3000]}", "{expr: top}", "{choice: [1, 3000]}"} {
		file := strings.Replace(withParams, "count: {expr: boxes}", "count: "+count, 1)
		file = strings.Replace(file, "      mood: mood\n", "      mood: mood\n      pairs: box.all(k, x, box.all(j, y, x.w + y.w >= 0))\n", 1)
		file = strings.Replace(file, "max: 50, description: largest n drawn", "max: 3000, description: largest n drawn", 1)
		w, err := Load("p.yaml", []byte(file))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range w.tools[0].obs {
			if f.key == "pairs" && f.val.fast != nil {
				t.Errorf("count %s: %q runs without cost tracking", count, f.val.src)
			}
		}
	}
}
