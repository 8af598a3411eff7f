package world

import "testing"

func TestBuiltinWorldsLoad(t *testing.T) {
	ws, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) == 0 {
		t.Fatal("no built-in worlds")
	}
}
