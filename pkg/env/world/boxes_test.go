package world

import (
	"runtime"
	"strconv"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// TestBoxesKeepTheirValues: a value boxed in a block is the value a conversion makes
// (its type, its equality, a type switch's case), across blocks reserved and made full
// and after collections, and boxing more never changes one handed out before.
func TestBoxesKeepTheirValues(t *testing.T) {
	var e episode
	var got, want []ref.Val
	for i := range 5 * boxChunk {
		if i%70 == 0 {
			e.box.reserve(boxCount{int64(i % 3), int64(i % 5)}) // blocks of 0 to 4, then of boxChunk
		}
		n := types.Int(int64(i)*7919 - 300) // negative, small and large
		s := types.String("s" + strconv.Itoa(i))
		if i%9 == 0 {
			s = ""
		}
		got = append(got, e.boxInt(n), e.boxString(s))
		want = append(want, n, s)
		if i%100 == 0 {
			runtime.GC()
		}
	}
	runtime.GC()
	for i := range got {
		switch g := got[i].(type) {
		case types.Int:
			if g != want[i].(types.Int) || got[i].Equal(want[i]) != types.True || got[i].Type() != types.IntType {
				t.Fatalf("value %d: boxed %v, want %v", i, g, want[i])
			}
		case types.String:
			if g != want[i].(types.String) || got[i].Equal(want[i]) != types.True || got[i].Type() != types.StringType {
				t.Fatalf("value %d: boxed %q, want %q", i, g, want[i])
			}
		default:
			t.Fatalf("value %d: boxed a %T", i, got[i])
		}
	}
}

// TestResetBoxesFit: after a first reset of the shop world, a new episode's reset boxes
// what it draws in the room it reserved, and the episode's values are those of a reset
// made with no room reserved (the hint cleared).
func TestResetBoxesFit(t *testing.T) {
	e := shopPort(t)
	w, _ := Of(e)
	for seed := uint64(1); seed <= 30; seed++ {
		var obs [2]string
		var vals [2][]ref.Val
		for k, hint := range []bool{false, true} {
			if !hint {
				w.resetBoxes[0].Store(0)
				w.resetBoxes[1].Store(0)
			}
			ep, err := e.NewEpisode(env.Config{Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			o, err := ep.Reset()
			if err != nil {
				t.Fatal(err)
			}
			we := ep.(*episode)
			if hint && (cap(we.box.ints) > int(w.resetBoxes[0].Load()) || cap(we.box.strs) > int(w.resetBoxes[1].Load())) {
				t.Errorf("seed %d: blocks of %d ints and %d strings, more than the %d and %d a reset boxed", seed,
					cap(we.box.ints), cap(we.box.strs), w.resetBoxes[0].Load(), w.resetBoxes[1].Load())
			}
			obs[k] = string(o)
			vals[k] = append(vals[k], we.vars...)
			for _, row := range we.ents[0].objs {
				vals[k] = append(vals[k], row.vals...)
			}
		}
		if obs[0] != obs[1] || len(vals[0]) != len(vals[1]) {
			t.Fatalf("seed %d: %s\nwith room reserved %s", seed, obs[0], obs[1])
		}
		for i := range vals[0] {
			if vals[0][i].Equal(vals[1][i]) != types.True {
				t.Fatalf("seed %d: value %d is %v, with room reserved %v", seed, i, vals[0][i], vals[1][i])
			}
		}
	}
}
