package world

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

var placeRE = regexp.MustCompile(`^f\.yaml:\d+:\d+: \S+: `)

// FuzzLoad: any bytes load or fail without a panic, and every error names a place (file,
// line, column and field).
func FuzzLoad(f *testing.F) {
	f.Add([]byte(small))
	b, err := builtinFS.ReadFile("builtin/bank.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	if b, err = builtinFS.ReadFile("builtin/airline.yaml"); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	if b, err = builtinFS.ReadFile("builtin/dispatch.yaml"); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("name: x\nservices: [a]\ntools: [{name: t, description: d}]\nsuccess: 'true'\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte(drawn))
	f.Add([]byte(withParams))
	if b, err = os.ReadFile("../../../examples/worlds/shop.yaml"); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("name: x\nentities: {e: {prefix: e-, count: {uniform: [1, 3]}, fields: {f: {type: int, expr: 'i * 2'}}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Load("f.yaml", data)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("error does not wrap ErrInvalid: %v", err)
		}
		var errs []error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
		for _, e := range errs {
			var le *LoadError
			if !errors.As(e, &le) || le.Line < 1 || le.Col < 1 {
				t.Fatalf("error without a place: %v", e)
			}
			if !placeRE.MatchString(e.Error()) && !strings.HasPrefix(e.Error(), "f.yaml:") {
				t.Fatalf("error does not start with its place: %q", e.Error())
			}
		}
	})
}

// FuzzBankStep feeds arbitrary actions to a bank episode, after a transfer that may be
// held: Step must never panic or fail (an expression failing on an agent's input would
// be a missing precondition), and every observation and diff must be valid JSON.
func FuzzBankStep(f *testing.F) {
	f.Add("transfer.create", []byte(`{"from":"acct-1","payee_id":"p-1","amount":300}`), uint64(1))
	f.Add("transfer.cancel", []byte(`{"transfer_id":"t-1"}`), uint64(2))
	f.Add("fraud.verify", []byte(`{"transfer_id":"t-1","code":"123456","code":"1"}`), uint64(3))
	f.Add("wait", []byte(`{"ms":1e3}`), uint64(4))
	f.Add("\xff", []byte("\x00"), uint64(5))
	f.Fuzz(func(t *testing.T, tool string, args []byte, seed uint64) {
		e := bank(t)
		ep, err := e.NewEpisode(env.Config{Seed: seed, Faults: stressPlan(t, seed), MaxSteps: 8})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		for _, a := range []env.Action{
			{Tool: "transfer.create", Args: json.RawMessage(`{"from":"acct-2","payee_id":"p-1","amount":300}`)},
			{Tool: tool, Args: args}, {Tool: "transfer.cancel", Args: args}, {Tool: "fraud.verify", Args: args},
		} {
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

// FuzzDispatchStep feeds arbitrary actions, of either role, in either role's turn, to a
// dispatch episode whose radio loses, delays and cuts messages: Step must never panic or
// fail, and every observation and diff must be valid JSON.
func FuzzDispatchStep(f *testing.F) {
	f.Add("dispatcher:radio.send", []byte(`{"to":"driver","text":"o-1@north"}`), uint64(1))
	f.Add("driver:radio.send", []byte(`{"to":"driver","text":"me"}`), uint64(2))
	f.Add("driver:truck.load", []byte(`{"order":"o-9"}`), uint64(3))
	f.Add(":wait", []byte(`{"ms":1}`), uint64(4))
	f.Add("dispatcher:", []byte("\x00"), uint64(5))
	f.Fuzz(func(t *testing.T, tool string, args []byte, seed uint64) {
		ep, err := dispatch(t).NewEpisode(dispatchStress(t, seed))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		for _, a := range []env.Action{
			{Tool: tool, Args: args}, {Tool: tool, Args: args},
			{Tool: "dispatcher:radio.send", Args: args}, {Tool: "driver:radio.send", Args: args},
		} {
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
