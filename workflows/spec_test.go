package workflows

import (
	"strings"
	"testing"
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
		{"bad types", "stages:\n  - {env: shop, episodes: {max: lots}}\n", []string{"cannot unmarshal !!str `lots`"}},
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
			[]string{"stages[0].drift[0].selector:", "stages[0].drift[1].schedule.points[1].value:"}},
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
