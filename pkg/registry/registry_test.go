package registry

import (
	"errors"
	"strings"
	"testing"
)

func TestRegistry(t *testing.T) {
	errUnknown := errors.New("unknown thing")
	r := New[int]("thing", errUnknown)
	r.Register("b", 2)
	r.Register("a", 1)
	if v, err := r.Lookup("a"); err != nil || v != 1 {
		t.Fatalf("Lookup(a) = %d, %v", v, err)
	}
	_, err := r.Lookup("c")
	if !errors.Is(err, errUnknown) || !strings.Contains(err.Error(), `"c" (known: [a b])`) {
		t.Fatalf("Lookup(c) error = %v", err)
	}
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "duplicate registration of a") {
			t.Fatalf("duplicate Register did not panic as expected: %v", p)
		}
	}()
	r.Register("a", 3)
}
