package world

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func airline(t testing.TB) env.Env {
	t.Helper()
	e, err := env.Lookup("airline")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// airlineStress hits every service of the airline with errors, Retry-After, latency and
// truncated answers, the rebooking write included.
func airlineStress(t testing.TB, seed uint64) env.Config {
	return env.Config{Seed: seed, Faults: injector(t, rng.Derive(seed, "plan"),
		httpErr("res-503", "reservations", 0.2, 503, 250),
		httpErr("flights-429", "flights", 0.1, 429, 1000),
		httpErr("any-500", "*", 0.03, 500, 0),
		latency("lat", "*", 0.5, 40, 20),
		truncate("search-trunc", "flight.search", 0.1, 0.5),
		truncate("change-trunc", "booking.change_flight", 0.15, 0.2),
		truncate("name-trunc", "booking.change_name", 0.15, 0.3),
	)}
}

// TestAirlineConformance runs the suite every env passes, the oracle under faults.
func TestAirlineConformance(t *testing.T) {
	envtest.Run(t, envtest.Subject{
		Env:    airline(t),
		Config: airlineStress,
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: "wait", Args: json.RawMessage(`{"ms":100}`)},
		ErrNotReset: ErrNotReset,
	})
}

// TestAirlineOracleSucceeds: the plan rebooks every passenger without faults, fixing the
// name where it is misspelt, and nearly every one under the stress plan.
func TestAirlineOracleSucceeds(t *testing.T) {
	e := airline(t)
	named, paid := 0, 0
	for seed := uint64(1); seed <= 200; seed++ {
		r, _, log := play(t, e, env.Config{Seed: seed})
		if r.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			t.Fatalf("seed %d: ended %s\n%s", seed, r.Reason, strings.Join(log, "\n"))
		}
		all := strings.Join(log, "\n")
		if strings.Contains(all, "booking.change_name") {
			named++
		}
		if strings.Contains(all, `"spent":75`) {
			paid++
		}
	}
	if named < 20 || named > 120 || paid < 10 || paid > 150 {
		t.Errorf("of 200 worlds %d needed a name correction and %d a change fee; both should be common but not universal", named, paid)
	}
	ok := 0
	for seed := uint64(1); seed <= 200; seed++ {
		cfg := airlineStress(t, seed)
		cfg.MaxSteps = 60
		r, _, log := play(t, e, cfg)
		switch r.Reason {
		case gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS:
			ok++
		case gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE:
			t.Fatalf("seed %d: the oracle failed under faults\n%s", seed, strings.Join(log, "\n"))
		}
	}
	if ok < 190 {
		t.Errorf("oracle succeeded in %d of 200 stressed episodes, want at least 190", ok)
	}
}

// field reads a field of an entity of an episode's state, as Go.
func field(ep env.Episode, entity, id, name string) any {
	e := ep.(*episode)
	k := -1 - e.w.slots[entity]
	o, _ := e.ents[k].row(id)
	return o.vals[o.t.index[name]].Value()
}

// TestAirlinePoliciesSayWhy: every policy refuses the change it forbids, as a causal
// violation with its reason and suggestion, and changes nothing; the flight the world
// keeps for the passenger is accepted.
func TestAirlinePoliciesSayWhy(t *testing.T) {
	e := airline(t)
	want := map[int64]string{0: "same_route", 1: "seats_available", 2: "rebook_window", 3: "check_in_open"}
	seen := map[string]int{}
	refuse := func(seed uint64, tool, args, rule string) {
		t.Helper()
		ep, err := e.NewEpisode(env.Config{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		r := mustStep(t, ep, tool, args)
		v := r.Signals.GetViolations()
		if len(v) != 1 || v[0].GetRule() != rule || v[0].GetReason() == "" || v[0].GetSuggestion() == "" || string(r.Diff) != "[]" {
			t.Fatalf("seed %d: %s %s: %s %v %s, want a %s violation and no change", seed, tool, args, r.Observation, v, r.Diff, rule)
		}
		seen[rule]++
	}
	for seed := uint64(1); seed <= 40; seed++ {
		ep, err := e.NewEpisode(env.Config{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		good := fmt.Sprintf("f-%d", varOf(ep, "good_slot").(int64)+1)
		for i := 2; i <= 6; i++ {
			id := fmt.Sprintf("f-%d", i)
			if id == good {
				continue
			}
			refuse(seed, "booking.change_flight", `{"booking_id":"b-1","flight_id":"`+id+`"}`, want[field(ep, "flight", id, "roll").(int64)])
		}
		refuse(seed, "booking.change_flight", `{"booking_id":"b-2","flight_id":"`+good+`"}`, "fare_allows_change")
		refuse(seed, "booking.change_flight", `{"booking_id":"b-1","flight_id":"f-7"}`, "same_route")
		refuse(seed, "booking.change_name", `{"booking_id":"b-1","name":"Mallory Smith"}`, "name_change_refused")
		if varOf(ep, "cabin") == "business" {
			refuse(seed, "booking.change_cabin", `{"booking_id":"b-1","cabin":"economy"}`, "no_cabin_downgrade")
		}
		r := mustStep(t, ep, "booking.change_flight", `{"booking_id":"b-1","flight_id":"`+good+`"}`)
		if len(r.Signals.GetViolations()) != 0 || field(ep, "booking", "b-1", "flight") != good {
			t.Fatalf("seed %d: rebooking onto %s: %s %v", seed, good, r.Observation, r.Signals.GetViolations())
		}
		refuse(seed, "booking.change_flight", `{"booking_id":"b-1","flight_id":"f-1"}`, "already_on_flight")
	}
	for _, rule := range []string{"same_route", "seats_available", "rebook_window", "check_in_open", "fare_allows_change", "name_change_refused", "no_cabin_downgrade"} {
		if seen[rule] == 0 {
			t.Errorf("no seed exercised %s", rule)
		}
	}
}

// TestAirlineChangeFee: a voluntary change of a standard fare pays the fee, as spend;
// an upgrade over the budget is refused.
func TestAirlineChangeFee(t *testing.T) {
	e := airline(t)
	for seed := uint64(1); seed <= 100; seed++ {
		ep, err := e.NewEpisode(env.Config{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		if varOf(ep, "involuntary") == true || varOf(ep, "fare") != "standard" {
			continue
		}
		good := fmt.Sprintf("f-%d", varOf(ep, "good_slot").(int64)+1)
		r := mustStep(t, ep, "booking.change_flight", `{"booking_id":"b-1","flight_id":"`+good+`"}`)
		if r.Signals.GetSpend() != 75 || varOf(ep, "spent") != int64(75) {
			t.Fatalf("seed %d: a voluntary standard change spent %v (state %v), want the fee of 75", seed, r.Signals.GetSpend(), varOf(ep, "spent"))
		}
		if varOf(ep, "cabin") == "economy" && field(ep, "flight", good, "biz_seats").(int64) > 0 {
			refusedOver := mustStep(t, ep, "booking.change_cabin", `{"booking_id":"b-1","cabin":"business"}`)
			if v := refusedOver.Signals.GetViolations(); len(v) != 1 || v[0].GetRule() != "upgrade_within_budget" {
				t.Fatalf("seed %d: an upgrade over the budget: %s %v", seed, refusedOver.Observation, v)
			}
		}
		return
	}
	t.Fatal("no seed of 100 had a voluntary change of a standard fare")
}
