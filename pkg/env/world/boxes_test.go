package world

import (
	"runtime"
	"strconv"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// TestBoxesKeepTheirValues: a value boxed in a block is the value a conversion makes
// (its type, its equality, a type switch's case), across several blocks and after
// collections, and boxing more never changes one handed out before.
func TestBoxesKeepTheirValues(t *testing.T) {
	var bx boxes
	var got []ref.Val
	var want []ref.Val
	for i := range 5 * boxChunk {
		n := types.Int(int64(i)*7919 - 300) // negative, small and large
		s := types.String("s" + strconv.Itoa(i))
		if i%9 == 0 {
			s = ""
		}
		got = append(got, bx.ofInt(n), bx.ofString(s))
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
