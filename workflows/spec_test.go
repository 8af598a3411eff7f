package workflows

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
)

func TestLoadSpecNamesEveryBadField(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown key", "stages: []\ncolour: red\n", []string{`line 2: unknown key "colour"`}},
		{"unknown stage key", "stages:\n  - {env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}, speed: 3}\n",
			[]string{`unknown key "speed"`}},
		{"no stages", "name: x\n", []string{"stages: at least one stage is needed"}},
		{"empty", "", []string{"empty document"}},
		{"bad types", "stages:\n  - {env: shop, episodes: {max: lots}}\n", []string{"stages[0].episodes.max: want a whole number, got \"lots\""}},
		{"window and budget", `
stages:
  - {env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 0.5, window: 0}}
  - {env: shop, policies: oracle=1, episodes: {min: 30, max: 20}, promotion: {metric: success_rate, threshold: 1.5, window: 40}}
`, []string{
			"stages[0].promotion.window: must be > 0",
			"stages[1].episodes.min: 30 is more than episodes.max 20",
			"stages[1].promotion.threshold: 1.5 is outside [0, 1]",
			"stages[1].promotion.window: 40 is more than episodes.max 20",
		}},
		{"metric", "stages:\n  - {env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: vibes, window: 10}}\n",
			[]string{`stages[0].promotion.metric: "vibes" is not one of success_rate, reward_mean`}},
		{"batch alignment", "stages:\n  - {env: shop, policies: oracle=1, batch: 3, episodes: {min: 10, max: 20}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n",
			[]string{"stages[0].batch: 3 does not divide promotion.window 10", "stages[0].episodes.min: 10 is not a multiple of the batch size 3", "stages[0].episodes.max: 20 is not a multiple"}},
		{"run fields", "stages:\n  - {env: moon, policies: telepathy=1, profiles: hurricane=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n",
			[]string{"stages[0].env:", "stages[0].policies[0]:", "stages[0].profile"}},
		{"params", "stages:\n  - {env: shop, params: {products: -4}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n",
			[]string{"stages[0].params:"}},
		{"drift", "stages:\n  - {env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}, drift: [{selector: '*.gravity.strength', from: 1, to: 2}, {selector: '*.latency.mean_ms', from: 10, to: -5}]}\n",
			[]string{"stages[0].drift[0].selector:", "stages[0].drift[1].to: *.latency.mean_ms: -5 is below the minimum 0 ms"}},
		{"reward spec", "stages:\n" + stageYAML(`, reward_spec: "name: s\nversion: '1'\ncomponents: [{name: x, expr: signals.progres, weight: 1}]\n"`),
			[]string{"stages[0].reward_spec:", "stages[0].reward_spec:3: components[0].expr: expression 1:8: undefined field 'progres'"}},
		{"duplicate names", "stages:\n  - {name: a, env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n  - {name: a, env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n",
			[]string{`stages[1].name: "a" is also the name of stages[0]`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadSpec(strings.NewReader(tt.yaml))
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
}

func TestLoadSpecDefaultsAndExample(t *testing.T) {
	s, err := LoadSpec(strings.NewReader("stages:\n  - {env: shop, policies: oracle=1, episodes: {max: 100}, promotion: {metric: success_rate, threshold: 0.9, window: 25}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	st := s.Stages[0]
	if st.Name != "stage-0" || st.Batch != 25 || st.Episodes.Min != 25 || st.Profiles != "baseline=1" || s.MaxInFlight == 0 {
		t.Errorf("defaults not filled: %+v", s)
	}
}

// okStage is a valid stage in flow style, with %s where a test adds keys.
const okStage = "  - {env: shop, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}%s}\n"

func stageYAML(extra string) string { return strings.Replace(okStage, "%s", extra, 1) }

func TestLoadSpecRefusesOversizedSpecWithoutEchoingIt(t *testing.T) {
	// 10 MB in one value: refused unread, by the same check validate and start make.
	big := "stages:\n  - {env: shop, policies: \"oracle=1," + strings.Repeat("x", 10<<20) + "\", episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n"
	_, err := LoadSpec(strings.NewReader(big))
	if !errors.Is(err, ErrSpecTooLarge) || len(err.Error()) > 200 {
		t.Fatalf("error %.300q; want ErrSpecTooLarge, short", err)
	}
	if _, err := ParseSpecJSON([]byte(`{"name":"` + strings.Repeat("x", 10<<20) + `"}`)); !errors.Is(err, ErrSpecTooLarge) {
		t.Fatalf("workflow input error %.300q; want ErrSpecTooLarge", err)
	}
	// Under the limit, a large bad value is quoted only in part.
	long := strings.Repeat("y", 500<<10)
	for _, spec := range []string{
		"stages:\n" + strings.Replace(stageYAML(""), "oracle=1", long+"=1", 1),
		"stages:\n" + strings.Replace(stageYAML(""), "success_rate", long, 1),
		"stages:\n" + stageYAML(", "+long+": 1"),
		"stages:\n" + strings.Replace(stageYAML(""), "max: 10", "max: "+long, 1),
		"stages:\n" + strings.Replace(stageYAML(""), "env: shop", "env: "+long, 1),
	} {
		_, err := LoadSpec(strings.NewReader(spec))
		if err == nil || len(err.Error()) > 2000 {
			t.Errorf("error of %d bytes; want a short one: %.300q", len(fmt.Sprint(err)), err)
		}
	}
}

func TestLoadSpecRefusesWhatStartCannotSend(t *testing.T) {
	// The default workflow id carries the name; Temporal refuses ids over 1000 bytes.
	_, err := LoadSpec(strings.NewReader("name: " + strings.Repeat("n", 2000) + "\nstages:\n" + stageYAML("")))
	if err == nil || !strings.Contains(err.Error(), "line 1: name: 2000 bytes is longer than 200") {
		t.Fatalf("error %.300q; want the name refused", err)
	}
	// Aliases make a small file a large spec: what start would send is checked too.
	var b strings.Builder
	b.WriteString("x: &a {k: \"" + strings.Repeat("v", 60<<10) + "\"}\n")
	b.WriteString("stages:\n  - {env: shop, params: {")
	for i := 0; i < 40; i++ {
		fmt.Fprintf(&b, "p%d: *a, ", i)
	}
	b.WriteString("}, policies: oracle=1, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 10}}\n")
	if b.Len() > MaxSpecBytes {
		t.Fatalf("test spec %d bytes", b.Len())
	}
	_, err = LoadSpec(strings.NewReader(b.String()))
	if !errors.Is(err, ErrSpecTooLarge) {
		t.Fatalf("error %.300q; want ErrSpecTooLarge", err)
	}
}

func TestLoadSpecNamesTheKeysTheUserWrote(t *testing.T) {
	spec := `name: keys
stages:
  - name: a
    env: shop
    policies: oracle=1
    episodes: {max: 10}
    promotion: {metric: success_rate, threshold: 1, window: 10}
    drift:
      - selector: "*.latency.mean_ms"
        from: 10
        to: -5
`
	_, err := LoadSpec(strings.NewReader(spec))
	if err == nil || !strings.Contains(err.Error(), "line 11: stages[0].drift[0].to: ") {
		t.Fatalf("error %q; want it at line 11, stages[0].drift[0].to", err)
	}
	if strings.Contains(err.Error(), "schedule") || strings.Contains(err.Error(), "points") {
		t.Errorf("error %q names the internal drift schedule", err)
	}
	_, err = LoadSpec(strings.NewReader("stages:\n  - env: shop\n    policies: oracle=1\n    episodes: {max: lots}\n    promotion: {metric: success_rate, threshold: 1, window: 10}\n"))
	if err == nil || !strings.Contains(err.Error(), "line 4: stages[0].episodes.max: want a whole number") || strings.Contains(err.Error(), "uint64") {
		t.Fatalf("error %q; want episodes.max at line 4, in words", err)
	}
}

func TestLoadSpecCallsNegativeCountsNegative(t *testing.T) {
	for _, tt := range []struct{ from, path string }{
		{"max: 10", "stages[0].episodes.max"},
		{"window: 10", "stages[0].promotion.window"},
		{"{env", "{batch: -1, env"},
	} {
		s := "stages:\n" + strings.Replace(stageYAML(""), tt.from, strings.Replace(tt.from, "10", "-1", 1), 1)
		if tt.from == "{env" {
			s = "stages:\n" + strings.Replace(stageYAML(""), tt.from, tt.path, 1)
			tt.path = "stages[0].batch"
		}
		_, err := LoadSpec(strings.NewReader(s))
		if err == nil || !strings.Contains(err.Error(), tt.path+": must not be negative") {
			t.Errorf("spec %q: error %q; want %s: must not be negative", s, err, tt.path)
		}
	}
	_, err := LoadSpec(strings.NewReader("seed: -3\nmax_in_flight: -1\nstages:\n" + stageYAML(", max_steps: -2")))
	for _, w := range []string{"line 1: seed: must not be negative", "line 2: max_in_flight: must not be negative", "stages[0].max_steps: must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %q; want %q", err, w)
		}
	}
}

func TestLoadSpecUnknownKeyDoesNotHideOtherErrors(t *testing.T) {
	_, err := LoadSpec(strings.NewReader("colour: red\nstages:\n" +
		"  - {env: shop, policies: oracle=1, speed: 3, episodes: {max: 10}, promotion: {metric: success_rate, threshold: 1, window: 0}}\n"))
	for _, w := range []string{`line 1: unknown key "colour"`, `line 3: unknown key "speed" in stages[0]`, "stages[0].promotion.window: must be > 0"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\ndoes not contain %q", err, w)
		}
	}
}

func TestValidateAndWorkflowInputAgree(t *testing.T) {
	// The JSON start sends is what the workflow accepts, and no more.
	s, err := LoadSpec(strings.NewReader(three("oracle=1")))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := EncodeSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseSpecJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := EncodeSpec(back)
	if string(again) != string(raw) {
		t.Errorf("workflow reads the spec as\n%s\nnot\n%s", again, raw)
	}
}

// FuzzLoadSpec: any input gives a spec or an error, never a panic, and an error never
// longer than the limits allow.
func FuzzLoadSpec(f *testing.F) {
	f.Add(three("oracle=1"))
	f.Add("stages:\n" + stageYAML(", drift: [{selector: '*.latency.mean_ms', from: 1, to: 2}]"))
	f.Add("stages: &s [*s]\n")
	f.Add("stages: [&m {drift: [*m]}]\n")
	f.Add("stages:\n  - params: [1]\n    episodes: 3\n")
	f.Fuzz(func(t *testing.T, in string) {
		_, err := LoadSpec(strings.NewReader(in))
		if err != nil && len(err.Error()) > (maxErrorLines+1)*(4*maxQuoted+200) {
			t.Fatalf("error of %d bytes", len(err.Error()))
		}
	})
}

// A stage naming a reward spec hands its text to each batch, whose run names it by digest.
func TestStageRewardSpecReachesTheRun(t *testing.T) {
	const spec = "name: s\nversion: '1'\ncomponents: [{name: x, expr: signals.progress, weight: 1}]\n"
	s, err := LoadSpec(strings.NewReader("stages:\n" + stageYAML(", reward_spec: \""+strings.ReplaceAll(spec, "\n", "\\n")+"\"")))
	if err != nil {
		t.Fatal(err)
	}
	if s.Stages[0].RewardSpec != spec {
		t.Fatalf("stage reward_spec %q, want the file's text", s.Stages[0].RewardSpec)
	}
	c := &curriculum{spec: s, st: &CurriculumState{}}
	in, err := c.nextBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	in.RunID = "c-s0b0"
	req, err := in.request()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := scoring.Parse("x", []byte(spec))
	if req.RewardSpec != want.Digest {
		t.Errorf("run names %q, want %s", req.RewardSpec, want.Digest)
	}
}
