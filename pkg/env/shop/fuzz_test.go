package shop

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// FuzzStep feeds arbitrary actions to an episode: Step must never panic or fail, and
// every observation and diff must be valid JSON.
func FuzzStep(f *testing.F) {
	f.Add("order.create", []byte(`{"sku":"sku-1","qty":2}`), uint64(1))
	f.Add("catalog.search", []byte(`{"query":"mug \u00e9\"x"}`), uint64(2))
	f.Add("payment.pay", []byte(`{"order_id":"o-1","order_id":"o-2"}`), uint64(3))
	f.Add("wait", []byte(`{"ms":1e3}`), uint64(4))
	f.Add("\xff", []byte("\x00"), uint64(5))
	f.Fuzz(func(t *testing.T, tool string, args []byte, seed uint64) {
		ep, err := New().NewEpisode(env.Config{Seed: seed, Faults: stressPlan(t, seed), MaxSteps: 8})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		for _, a := range []env.Action{{Tool: tool, Args: args}, {Tool: "order.create", Args: args}, {Tool: "payment.pay", Args: args}} {
			r, err := ep.Step(a)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(r.Observation) || !json.Valid(r.Diff) {
				t.Fatalf("invalid JSON: obs %q diff %q", r.Observation, r.Diff)
			}
			if r.Done() {
				return
			}
		}
	})
}

// FuzzMembers checks that the hand-written scanner agrees with encoding/json on every
// input it accepts.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, ` { "a" : "b" , "c":-12 } `, `{"a":01}`, `{"a":"b","a":"c"}`, `{"a":"\u0041"}`, `{"a":1}x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || b[0] != '{' {
			return
		}
		fast, ok := scanFlat(b)
		if !ok {
			return
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("scanFlat accepted %q, encoding/json rejects it: %v", b, err)
		}
		slow := make([]member, 0, len(m))
		for _, k := range sortedKeys(m) {
			slow = append(slow, member{k, m[k]})
		}
		if len(fast) != len(slow) || (len(fast) > 0 && !reflect.DeepEqual(fast, slow)) {
			t.Fatalf("%q: scanFlat %q, encoding/json %q", b, fast, slow)
		}
	})
}
