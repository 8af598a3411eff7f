package world

import (
	"unsafe"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// Boxes. A state value is a ref.Val, and Go allocates a copy of an int or a string
// header for every such interface it makes from one (an int from 0 to 255 excepted,
// the empty string too): a reset's drawn ints beyond that (the skus' random bits, a
// filler's -1) and its computed strings (a sku, a name) were 40 of its 95
// allocations. The episode instead writes them into blocks of its own, one allocation
// a block, and hands out interfaces whose data points into the block: what the
// conversion would make, the copy placed elsewhere. A slot is written once and never
// again (a block is only appended to and replaced when full, as joinStrings' is), so
// the value an interface holds never changes; the block lives as long as any of its
// values.

// boxChunk is how many values a block of boxes holds.
const boxChunk = 64

// boxes are an episode's blocks of boxed ints and strings; made counts the values
// boxed in them.
type boxes struct {
	ints []types.Int
	strs []types.String
	made boxCount
}

// boxCount counts boxed ints and strings.
type boxCount struct{ ints, strs int64 }

// maxBoxHint bounds the room a reset makes for its boxes up front.
const maxBoxHint = 4096

// reserve makes room for n more boxes at least: a reset's first blocks sized to what a
// reset of its world boxed before (World.resetBoxes), not to boxChunk, of which an
// episode made for one reset used a third.
func (bx *boxes) reserve(n boxCount) {
	if int64(cap(bx.ints)-len(bx.ints)) < n.ints {
		bx.ints = make([]types.Int, 0, n.ints)
	}
	if int64(cap(bx.strs)-len(bx.strs)) < n.strs {
		bx.strs = make([]types.String, 0, n.strs)
	}
}

// iface is the layout of a non-empty interface value: its type's table, then a
// pointer to its data.
type iface struct {
	tab  unsafe.Pointer
	data unsafe.Pointer
}

// boxInt returns v as a ref.Val, written into the episode's block when converting it
// would allocate.
func (e *episode) boxInt(v types.Int) ref.Val {
	if v >= 0 && v < 256 {
		return v // the runtime's own boxes: no allocation
	}
	if len(e.box.ints) == cap(e.box.ints) {
		e.box.ints = make([]types.Int, 0, boxChunk)
	}
	e.box.ints = append(e.box.ints, v)
	e.box.made.ints++
	var r ref.Val = types.Int(0)
	(*iface)(unsafe.Pointer(&r)).data = unsafe.Pointer(&e.box.ints[len(e.box.ints)-1])
	return r
}

// boxString is boxInt for a string.
func (e *episode) boxString(v types.String) ref.Val {
	if v == "" {
		return v // no allocation
	}
	if len(e.box.strs) == cap(e.box.strs) {
		e.box.strs = make([]types.String, 0, boxChunk)
	}
	e.box.strs = append(e.box.strs, v)
	e.box.made.strs++
	var r ref.Val = types.String("")
	(*iface)(unsafe.Pointer(&r)).data = unsafe.Pointer(&e.box.strs[len(e.box.strs)-1])
	return r
}
