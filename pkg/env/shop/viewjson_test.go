package shop

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// observations plays the oracle through episodes under the stress plan and returns every
// observation the shop showed it after the first: the inputs decodeView exists for.
func observations(t testing.TB, episodes int) [][]byte {
	t.Helper()
	var out [][]byte
	o := New().(env.Oracle)
	for seed := uint64(0); seed < uint64(episodes); seed++ {
		ep, obs := newEp(t, env.Config{Seed: seed, Faults: stressPlan(t, seed)})
		agent := o.Oracle(seed)
		for i := uint32(0); ; i++ {
			a, err := agent.Act(env.Turn{Step: i, Observation: obs})
			if err != nil {
				t.Fatal(err)
			}
			r, err := ep.Step(a)
			if err != nil {
				t.Fatal(err)
			}
			obs = r.Observation
			out = append(out, obs)
			if r.Done() {
				break
			}
		}
	}
	return out
}

// Every observation the shop emits, truncated ones included, takes the fast path and
// decodes exactly as encoding/json decodes it; otherwise the fast path would be dead code
// (or wrong) without anyone noticing.
func TestDecodeViewTakesEveryShopObservation(t *testing.T) {
	obs := observations(t, 300)
	truncated := 0
	for _, b := range obs {
		var fast, want view
		if !decodeView(b, &fast) {
			t.Fatalf("decodeView declined a shop observation: %s", b)
		}
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("encoding/json: %v: %s", err, b)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("decodeView = %+v, encoding/json = %+v for %s", fast, want, b)
		}
		if fast.Truncated {
			truncated++
		}
	}
	if truncated == 0 {
		t.Fatalf("no truncated observation among %d: the stress plan no longer truncates", len(obs))
	}
	t.Logf("%d observations, %d truncated", len(obs), truncated)
}

// Whenever decodeView answers, encoding/json accepts the same input and decodes the same
// view; when it declines, v is untouched.
func FuzzDecodeView(f *testing.F) {
	for _, b := range observations(f, 20) {
		f.Add(b)
	}
	for _, s := range []string{
		`{}`, ` {"ok":true} `, `{"OK":true}`, `{"ok":null}`, `{"ok":1}`, `{"status":-1}`,
		`{"status":4294967296}`, `{"stock":1.5}`, `{"stock":1e3}`, `{"stock":-9223372036854775808}`,
		`{"stock":9223372036854775808}`, `{"rule":"a\"b"}`, `{"rule":"é"}`, `{"results":null}`,
		`{"results":[]}`, `{"results":[null]}`, `{"results":[{"SKU":"x"}]}`, `{"results":[{"sku":"a","x":[1,{"y":"\u00e9"}]}]}`,
		`{"x":"\ud800"}`, `{"ok":true,"ok":false}`, `[]`, `{"ok":true}x`, `{"a":01}`, `{"a":-}`,
		`{"a":"\x01"}`, `{"a":[1,]}`, `{"a":{"b":}}`, `{"a":tru}`, "{\"a\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast := view{Rule: "untouched"}
		ok := decodeView(b, &fast)
		if !ok {
			if !reflect.DeepEqual(fast, view{Rule: "untouched"}) {
				t.Fatalf("declined but changed v: %+v", fast)
			}
			return
		}
		var want view
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("decodeView accepted what encoding/json rejects (%v): %q", err, b)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("decodeView = %+v, encoding/json = %+v for %q", fast, want, b)
		}
	})
}

// BenchmarkDecodeView decodes the oracle's observations both ways, side by side:
// go test -run '^$' -bench DecodeView -count 6 ./pkg/env/shop/
func BenchmarkDecodeView(b *testing.B) {
	obs := observations(b, 100)
	b.Run("decodeView", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			var v view
			if !decodeView(obs[i%len(obs)], &v) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			var v view
			if err := json.Unmarshal(obs[i%len(obs)], &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The oracle's actions are byte for byte what json.Marshal made of their maps before
// call built them by hand, for any string and integer.
func FuzzOracleArgsMatchJSON(f *testing.F) {
	for _, s := range []string{"", "usb-c cable", "ord-000017", `a"b`, `a\b`, "<&>", "é", "\x00\x1f", "\xff", "\u2028"} {
		f.Add(s, int64(3))
	}
	f.Add("x", int64(-9223372036854775808))
	f.Fuzz(func(t *testing.T, s string, n int64) {
		o := &oracle{}
		for _, c := range []struct {
			got  env.Action
			want map[string]any
		}{
			{o.call("t", str("order_id", s)), map[string]any{"order_id": s}},
			{o.call("t", num("qty", n), str("sku", s)), map[string]any{"sku": s, "qty": n}},
			{o.call("t", num("ms", n)), map[string]any{"ms": n}},
		} {
			want, err := json.Marshal(c.want)
			if err != nil {
				t.Fatal(err)
			}
			if string(c.got.Args) != string(want) {
				t.Fatalf("call made %s, json.Marshal %s", c.got.Args, want)
			}
		}
	})
}

// resets returns the first observation of episodes episodes, stressed.
func resets(t testing.TB, episodes int) [][]byte {
	t.Helper()
	var out [][]byte
	for seed := uint64(0); seed < uint64(episodes); seed++ {
		_, obs := newEp(t, env.Config{Seed: seed, Faults: stressPlan(t, seed)})
		out = append(out, obs)
	}
	return out
}

// Every first observation the shop makes takes decodeTask's fast path, with encoding/json's
// result.
func TestDecodeTaskTakesEveryShopReset(t *testing.T) {
	for _, b := range resets(t, 300) {
		var fast, want taskView
		if !decodeTask(b, &fast) {
			t.Fatalf("decodeTask declined a shop reset: %s", b)
		}
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("encoding/json: %v: %s", err, b)
		}
		if fast != want || fast.Item == "" || fast.Qty < 1 {
			t.Fatalf("decodeTask = %+v, encoding/json = %+v for %s", fast, want, b)
		}
	}
}

// Whenever decodeTask answers, encoding/json accepts the same input and decodes the same
// taskView; when it declines, v is untouched.
func FuzzDecodeTask(f *testing.F) {
	for _, b := range resets(f, 10) {
		f.Add(b)
	}
	for _, s := range []string{
		`{}`, `{"ITEM":"x"}`, `{"qty":null}`, `{"qty":1.0}`, `{"item":"a\"b"}`, `{"item":"é"}`,
		`{"qty":1,"qty":2}`, `{"tools":["a",{"b":[1]}],"item":"mug","qty":2}`, `{"item":1}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast := taskView{Item: "untouched"}
		if !decodeTask(b, &fast) {
			if fast != (taskView{Item: "untouched"}) {
				t.Fatalf("declined but changed v: %+v", fast)
			}
			return
		}
		var want taskView
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("decodeTask accepted what encoding/json rejects (%v): %q", err, b)
		}
		if fast != want {
			t.Fatalf("decodeTask = %+v, encoding/json = %+v for %q", fast, want, b)
		}
	})
}
