package world

import (
	"strconv"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// parts is a world whose end conditions share an exists over boxes, and have one over
// marks.
const parts = `name: parts
services: [svc]
vars:
  n: {type: int, value: 0}
  limit: {type: int, value: 3}
entities:
  box:
    prefix: b-
    count: {value: 3}
    fields:
      v: {type: int, uniform: [0, 2]}
  mark:
    prefix: m-
    fields:
      w: {type: int, value: 0}
tools:
  - name: bump
    service: svc
    description: adds one to n
    effects: [{set: n, to: n + 1}]
    observation: {n: n}
  - name: mark
    service: svc
    description: adds a mark of weight n
    effects: [{add: mark, fields: {w: n}}]
    observation: {id: new_id}
  - name: grow
    service: svc
    description: sets the first box's value to 100
    effects: [{set: box.v, key: "'b-1'", to: "100"}]
    observation: {v: "box['b-1'].v"}
success: box.exists(k, b, b.v > limit) && mark.exists(k, m, m.w > 2)
failure: n > 10 && !box.exists(k, b, b.v > limit)
`

// TestEndPartsStand: an exists of the end conditions is evaluated once for the two
// that have it, and its value stands while steps write nothing it reads: changed
// behind the steps' back, the state is not seen until a step writes the boxes.
func TestEndPartsStand(t *testing.T) {
	w, err := Load("parts.yaml", []byte(parts))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.parts) != 2 {
		t.Fatalf("%d parts, want 2 (the boxes' exists, shared, and the marks')", len(w.parts))
	}
	e, err := w.Env().NewEpisode(env.Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reset(); err != nil {
		t.Fatal(err)
	}
	ep := e.(*episode)
	boxes := -1
	for text, j := range w.partText {
		if strings.Contains(text, "box") {
			boxes = j
		}
	}
	step := func(tool string) env.StepResult {
		t.Helper()
		r, err := e.Step(env.Action{Tool: tool, Args: []byte("{}")})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	step("bump")
	if !ep.partKnown[boxes] || bool(ep.partValue[boxes]) {
		t.Fatalf("after the first step the boxes' part is known %v, %v; want known, false", ep.partKnown[boxes], ep.partValue[boxes])
	}
	// Behind the steps' back: every box over the limit. Steps that write n and marks
	// leave the boxes' part as it was; success needs it.
	for _, o := range ep.ents[0].objs {
		o.vals[1] = types.Int(50)
	}
	for range 3 {
		step("bump")
	}
	if r := step("mark"); r.Signals.Success || !ep.partKnown[boxes] || bool(ep.partValue[boxes]) {
		t.Fatalf("the boxes' part was evaluated again after steps that do not write boxes (success %v, value %v)", r.Signals.Success, ep.partValue[boxes])
	}
	// A step that writes the boxes makes it evaluated again: now it holds, and with a
	// mark of weight 4 so does success.
	if r := step("grow"); !r.Signals.Success || !bool(ep.partValue[boxes]) {
		t.Fatalf("after grow: success %v, boxes' part %v; want both true", r.Signals.Success, ep.partValue[boxes])
	}
}

// TestCollectionRowIsTheMap: a collection finds an id by looking through its ids up to
// smallCollection entities and in its map beyond, and either way finds what a map of
// every put would (the last entity put with an id), before and after the switch.
func TestCollectionRowIsTheMap(t *testing.T) {
	for _, n := range []int{0, 1, smallCollection - 1, smallCollection, smallCollection + 1, 3 * smallCollection} {
		var c collection
		want := map[string]*object{}
		for i := range n {
			id := "e" + strconv.Itoa(i%7) // ids come back, before the map and after
			o := &object{vals: []ref.Val{types.String(id)}}
			c.put(id, o)
			want[id] = o
			for j := range 9 {
				k := "e" + strconv.Itoa(j)
				got, ok := c.row(k)
				if w, wok := want[k]; got != w || ok != wok {
					t.Fatalf("%d puts: row(%s) = %p, %v; the map has %p, %v", i+1, k, got, ok, w, wok)
				}
			}
		}
		if got := (c.rows != nil); got != (n > smallCollection) {
			t.Errorf("%d entities: a map %v", n, got)
		}
		if len(c.ids) != n || len(c.objs) != n {
			t.Errorf("%d puts: %d ids, %d entities", n, len(c.ids), len(c.objs))
		}
	}
}
